//! `ModelSpec`: what the registry knows about one selectable model before it is loaded.

use std::path::PathBuf;

use serde::Serialize;

/// Where a model's files come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSource {
    /// The scripted demo policy: no files, no weights.
    Demo,
    /// A Hugging Face hub repository at a revision (branch, tag or commit).
    Hub {
        /// `owner/name`.
        repo: String,
        /// Branch, tag or commit; `main` by default.
        revision: String,
    },
    /// A local directory in the HF layout (config.json, *.safetensors, tokenizer files).
    Local(PathBuf),
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Demo => write!(f, "built-in demo"),
            ModelSource::Hub { repo, revision } => write!(f, "hf://{repo}@{revision}"),
            ModelSource::Local(p) => write!(f, "{}", p.display()),
        }
    }
}

/// One selectable model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelSpec {
    /// Stable key hosts select the model by (`"qwen3-0.6b"`).
    pub key: String,
    /// Human label (`"Qwen3 0.6B"`).
    pub label: String,
    /// Where the files come from.
    pub source: ModelSource,
    /// Qwen3's `enable_thinking`; must match how the model was trained.
    pub enable_thinking: bool,
    /// `false` lists the model as "coming soon"; `get_policy` refuses it.
    pub available: bool,
    /// A LoRA adapter over another key's model: that key (the base, loaded once and shared);
    /// `source` then names the adapter's files (`adapter_config.json` +
    /// `adapter_model.safetensors`). `None`: a model of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter_of: Option<String>,
}

impl ModelSpec {
    /// The scripted demo entry.
    pub fn demo() -> Self {
        Self {
            key: "demo".into(),
            label: "Demo (scripted, no model)".into(),
            source: ModelSource::Demo,
            enable_thinking: false,
            available: true,
            adapter_of: None,
        }
    }

    /// A model from the Hugging Face hub at `revision`.
    pub fn hub(key: &str, label: &str, repo: &str, revision: &str) -> Self {
        Self {
            key: key.into(),
            label: label.into(),
            source: ModelSource::Hub {
                repo: repo.into(),
                revision: revision.into(),
            },
            enable_thinking: false,
            available: true,
            adapter_of: None,
        }
    }

    /// A model from a local directory.
    pub fn local(key: &str, label: &str, dir: impl Into<PathBuf>) -> Self {
        Self {
            key: key.into(),
            label: label.into(),
            source: ModelSource::Local(dir.into()),
            enable_thinking: false,
            available: true,
            adapter_of: None,
        }
    }

    /// A PEFT LoRA adapter (a local directory, or a hub repository with `source`) over the
    /// model of key `base`: `get_policy(key)` shares the base's weights and engine, and every
    /// request runs through the adapter. Its `enable_thinking` is the base's unless set.
    pub fn adapter(key: &str, label: &str, base: &str, source: ModelSource) -> Self {
        Self {
            key: key.into(),
            label: label.into(),
            source,
            enable_thinking: false,
            available: true,
            adapter_of: Some(base.into()),
        }
    }

    /// Sets `enable_thinking`.
    pub fn thinking(mut self, enable: bool) -> Self {
        self.enable_thinking = enable;
        self
    }

    /// Marks the model as not yet available ("coming soon").
    pub fn coming_soon(mut self) -> Self {
        self.available = false;
        self
    }

    /// Whether this is the demo entry.
    pub fn is_demo(&self) -> bool {
        self.source == ModelSource::Demo
    }
}
