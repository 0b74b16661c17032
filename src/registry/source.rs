//! Resolving a model's files: from a local directory, or from the Hugging Face hub through
//! `hf-hub` (revision honoured, its cache used, `HF_HUB_OFFLINE=1` respected, a progress bar
//! while downloading).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::spec::ModelSource;
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
    /// `chat_template.jinja`, when the model has one (it takes precedence, as in HF).
    pub chat_template: Option<PathBuf>,
    /// The safetensors files (one, or the shards of an index).
    pub weights: Vec<PathBuf>,
}

/// Finds every file of a model; downloads from the hub when needed.
pub fn resolve(key: &str, source: &ModelSource) -> Result<ModelFiles> {
    match source {
        ModelSource::Demo => Err(Error::DemoMisuse {
            key: key.into(),
            what: "model files",
        }),
        ModelSource::Local(dir) => resolve_local(key, dir),
        ModelSource::Hub { repo, revision } => resolve_hub(repo, revision),
    }
}

fn load_err(key: &str, reason: impl Into<String>) -> Error {
    Error::Load {
        key: key.into(),
        reason: reason.into(),
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
    let weights = if let Some(single) = maybe("model.safetensors") {
        vec![single]
    } else if let Some(index) = maybe("model.safetensors.index.json") {
        shard_names(&index)?
            .into_iter()
            .map(|n| need(&n))
            .collect::<Result<Vec<_>>>()?
    } else {
        return Err(load_err(
            key,
            format!(
                "{} has no model.safetensors nor model.safetensors.index.json",
                dir.display()
            ),
        ));
    };
    Ok(ModelFiles {
        dir: dir.to_path_buf(),
        config: need("config.json")?,
        tokenizer: need("tokenizer.json")?,
        tokenizer_config: need("tokenizer_config.json")?,
        generation_config: maybe("generation_config.json"),
        chat_template: maybe("chat_template.jinja"),
        weights,
    })
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
        if !names.iter().any(|n| n == f) {
            names.push(f.to_string());
        }
    }
    if names.is_empty() {
        return Err(Error::file(index, "`weight_map` names no files"));
    }
    Ok(names)
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false)
}

type Fetch<'a> = dyn Fn(&str) -> Result<PathBuf> + 'a;

fn resolve_hub(repo_id: &str, revision: &str) -> Result<ModelFiles> {
    use hf_hub::{Repo, RepoType};
    let repo = Repo::with_revision(repo_id.to_string(), RepoType::Model, revision.to_string());
    let dl_err = |file: &str, reason: String| Error::Download {
        repo: repo_id.into(),
        revision: revision.into(),
        file: file.into(),
        reason,
    };
    let fetch: Box<Fetch<'_>> = if offline() {
        let cache = hf_hub::Cache::from_env().repo(repo.clone());
        Box::new(move |file: &str| {
            cache.get(file).ok_or_else(|| {
                dl_err(
                    file,
                    "HF_HUB_OFFLINE is set and the file is not in the local hub cache".into(),
                )
            })
        })
    } else {
        let api = hf_hub::api::sync::ApiBuilder::from_env()
            .with_progress(true)
            .build()
            .map_err(|e| dl_err("(api)", e.to_string()))?;
        let api_repo = api.repo(repo.clone());
        Box::new(move |file: &str| {
            tracing::info!(
                repo = repo_id,
                revision,
                file,
                "fetching from the Hugging Face hub"
            );
            api_repo.get(file).map_err(|e| dl_err(file, e.to_string()))
        })
    };
    let config = fetch("config.json")?;
    let tokenizer = fetch("tokenizer.json")?;
    let tokenizer_config = fetch("tokenizer_config.json")?;
    let generation_config = fetch("generation_config.json").ok();
    let chat_template = fetch("chat_template.jinja").ok();
    let weights = match fetch("model.safetensors") {
        Ok(p) => vec![p],
        Err(single_err) => match fetch("model.safetensors.index.json") {
            Ok(index) => shard_names(&index)?
                .iter()
                .map(|n| fetch(n))
                .collect::<Result<Vec<_>>>()?,
            Err(_) => return Err(single_err),
        },
    };
    let dir = config.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok(ModelFiles {
        dir,
        config,
        tokenizer,
        tokenizer_config,
        generation_config,
        chat_template,
        weights,
    })
}
