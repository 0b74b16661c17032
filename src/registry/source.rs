//! Resolving a model's files: from a local directory, or from the Hugging Face hub through
//! `hf-hub` (revision honoured, its cache used, `HF_HUB_OFFLINE=1` respected, a progress bar
//! while downloading).

use std::path::{Path, PathBuf};

use super::spec::ModelSource;
use crate::engine::model::files::{ModelFiles, shard_names};
use crate::error::{Error, Result};

/// Finds every file of a model; downloads from the hub when needed.
pub fn resolve(key: &str, source: &ModelSource) -> Result<ModelFiles> {
    match source {
        ModelSource::Demo => Err(Error::DemoMisuse {
            key: key.into(),
            what: "model files",
        }),
        ModelSource::Local(dir) => ModelFiles::from_dir(key, dir),
        ModelSource::Hub { repo, revision } => resolve_hub(repo, revision),
    }
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

/// The directory of a LoRA adapter (`adapter_config.json` + `adapter_model.safetensors`): a
/// local directory as it is, a hub repository fetched (or found in the cache offline).
pub fn resolve_adapter(key: &str, source: &ModelSource) -> Result<PathBuf> {
    match source {
        ModelSource::Demo => Err(Error::DemoMisuse {
            key: key.into(),
            what: "adapter files",
        }),
        ModelSource::Local(dir) => Ok(dir.clone()),
        ModelSource::Hub { repo, revision } => {
            let fetch = hub_fetcher(repo, revision)?;
            let config = fetch("adapter_config.json")?;
            fetch("adapter_model.safetensors")?;
            Ok(config.parent().map(Path::to_path_buf).unwrap_or_default())
        }
    }
}

fn resolve_hub(repo_id: &str, revision: &str) -> Result<ModelFiles> {
    let fetch = hub_fetcher(repo_id, revision)?;
    let config = fetch("config.json")?;
    let tokenizer = fetch("tokenizer.json")?;
    let tokenizer_config = fetch("tokenizer_config.json")?;
    let generation_config = fetch("generation_config.json").ok();
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
        weights,
    })
}

/// Fetches files of a hub repository at a revision (from the cache alone offline).
fn hub_fetcher<'a>(repo_id: &'a str, revision: &'a str) -> Result<Box<Fetch<'a>>> {
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
    Ok(fetch)
}
