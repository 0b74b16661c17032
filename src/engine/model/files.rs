//! A model's files on local disk (`config.json`, the safetensors files, the tokenizer files)
//! and finding them in a directory in the Hugging Face layout. Where the directory comes from
//! (a local path, the hub) is the registry's business.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// The files of one model, all on local disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// Directory of `config.json` (for the hub: the snapshot directory).
    pub dir: PathBuf,
    /// `config.json`.
    pub config: PathBuf,
    /// `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// `tokenizer_config.json` (chat template, special tokens).
    pub tokenizer_config: PathBuf,
    /// `generation_config.json`, when the model has one.
    pub generation_config: Option<PathBuf>,
    /// The safetensors files (one, or the shards of an index).
    pub weights: Vec<PathBuf>,
}

fn load_err(key: &str, reason: impl Into<String>) -> Error {
    Error::Load {
        key: key.into(),
        reason: reason.into(),
    }
}

impl ModelFiles {
    /// Finds every file of the model `key` in a local directory in the Hugging Face layout.
    pub fn from_dir(key: &str, dir: &Path) -> Result<Self> {
        resolve_local(key, dir)
    }
}

fn resolve_local(key: &str, dir: &Path) -> Result<ModelFiles> {
    if !dir.is_dir() {
        return Err(load_err(
            key,
            format!(
                "model directory {} does not exist; pass a directory holding config.json, *.safetensors and the tokenizer files",
                dir.display()
            ),
        ));
    }
    let need = |name: &str| -> Result<PathBuf> {
        let p = dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(load_err(
                key,
                format!(
                    "{} is missing `{name}` (a model directory in the Hugging Face layout is needed)",
                    dir.display()
                ),
            ))
        }
    };
    let maybe = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
    let weights = safetensors_in(dir).map_err(|e| load_err(key, e.to_string()))?;
    Ok(ModelFiles {
        dir: dir.to_path_buf(),
        config: need("config.json")?,
        tokenizer: need("tokenizer.json")?,
        tokenizer_config: need("tokenizer_config.json")?,
        generation_config: maybe("generation_config.json"),
        weights,
    })
}

/// The safetensors files of a model directory: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` names (each must exist).
pub fn safetensors_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if single.is_file() {
        return Ok(vec![single]);
    }
    if !index.is_file() {
        return Err(Error::file(
            dir,
            "no model.safetensors nor model.safetensors.index.json here (a model directory in the Hugging Face layout is needed)",
        ));
    }
    shard_names(&index)?
        .into_iter()
        .map(|n| {
            let p = dir.join(&n);
            if p.is_file() {
                Ok(p)
            } else {
                Err(Error::file(
                    &index,
                    format!("names shard `{n}`, which is missing"),
                ))
            }
        })
        .collect()
}

/// The distinct shard file names of a `model.safetensors.index.json`, in first-seen order.
pub fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::file(index, e))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Error::file(index, format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::file(index, "no `weight_map` object"))?;
    let mut names: Vec<String> = Vec::new();
    for f in map.values().filter_map(Value::as_str) {
        let plain = !f.is_empty()
            && !f.contains(['/', '\\'])
            && f != ".."
            && f != "."
            && !Path::new(f).is_absolute();
        if !plain {
            return Err(Error::file(
                index,
                format!("shard `{f}` is not a file name inside the model directory"),
            ));
        }
        if !names.iter().any(|n| n == f) {
            names.push(f.to_string());
        }
    }
    if names.is_empty() {
        return Err(Error::file(index, "`weight_map` names no files"));
    }
    Ok(names)
}
