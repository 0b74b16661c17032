//! `LoadedModel`: everything of one model that is loaded once per process and shared by every
//! policy of that model: config, tokenizer, chat template, generation defaults, the engine.

use std::sync::Arc;
use std::time::Instant;

use tokenizers::Tokenizer;

use super::source;
use super::spec::ModelSpec;
use crate::engine::model::files::ModelFiles;
use crate::engine::{
    AdapterHandle, Engine, EngineOptions, GenerationConfig, ModelConfig, model::config::token_ids,
};
use crate::error::{Error, Result};
use crate::policy::format::ChatTemplate;

/// A loaded model, shared (`Arc`) by every policy of its key.
pub struct LoadedModel {
    spec: ModelSpec,
    files: ModelFiles,
    config: ModelConfig,
    generation: GenerationConfig,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    eos_token_ids: Vec<u32>,
    engine: Engine,
    /// The LoRA adapter every request of this key runs through (an adapter key over a base
    /// key's engine); replaced in place by a weight update of the key.
    adapter: Option<Arc<parking_lot::RwLock<AdapterHandle>>>,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("key", &self.spec.key)
            .field("dir", &self.files.dir)
            .field("model_type", &self.config.model_type)
            .finish()
    }
}

impl LoadedModel {
    /// Resolves the files of `spec` (download if needed) and loads everything.
    pub fn load(spec: &ModelSpec, options: &EngineOptions) -> Result<Self> {
        let started = Instant::now();
        let key = spec.key.as_str();
        let files = source::resolve(key, &spec.source)?;
        let wrap = |e: Error| e.loading(key);
        let config = ModelConfig::from_file(&files.config).map_err(wrap)?;
        let generation = match &files.generation_config {
            Some(p) => GenerationConfig::from_file(p).map_err(wrap)?,
            None => GenerationConfig::default(),
        };
        let tokenizer = Tokenizer::from_file(&files.tokenizer).map_err(|e| Error::Load {
            key: key.to_string(),
            reason: format!(
                "{}: not a valid tokenizer.json: {e}",
                files.tokenizer.display()
            ),
        })?;
        // The template sits beside tokenizer_config.json (a hub snapshot keeps every file there).
        let template_dir = files.tokenizer_config.parent().unwrap_or(&files.dir);
        let template = ChatTemplate::from_model_dir(template_dir).map_err(wrap)?;
        let eos_token_ids = eos_ids(&generation, &config, &files, &tokenizer);
        if eos_token_ids.is_empty() {
            tracing::warn!(
                model = key,
                "no EOS token found; generation stops only on length or stop strings"
            );
        }
        let tokenizer = Arc::new(tokenizer);
        let engine = Engine::load(
            key,
            &config,
            &files.weights,
            tokenizer.clone(),
            &eos_token_ids,
            options,
        )
        .map_err(wrap)?;
        tracing::info!(model = key, dir = %files.dir.display(), secs = started.elapsed().as_secs_f32(), "model loaded");
        Ok(Self {
            spec: spec.clone(),
            files,
            config,
            generation,
            tokenizer,
            template,
            eos_token_ids,
            engine,
            adapter: None,
        })
    }

    /// Adapter key `spec` over the loaded `base`: reads the adapter (`spec.source`) into the
    /// base's engine and shares everything else of the base.
    pub fn load_adapter(spec: &ModelSpec, base: &LoadedModel) -> Result<Self> {
        let started = Instant::now();
        let dir = source::resolve_adapter(&spec.key, &spec.source)?;
        let handle = base.engine.load_adapter(&spec.key, &dir)?;
        tracing::info!(model = %spec.key, base = %base.spec.key, dir = %dir.display(), rank = handle.rank(), digest = %handle.version().digest, secs = started.elapsed().as_secs_f32(), "LoRA adapter loaded");
        Ok(Self {
            spec: spec.clone(),
            files: base.files.clone(),
            config: base.config.clone(),
            generation: base.generation.clone(),
            tokenizer: base.tokenizer.clone(),
            template: base.template.clone(),
            eos_token_ids: base.eos_token_ids.clone(),
            engine: base.engine.clone(),
            adapter: Some(Arc::new(parking_lot::RwLock::new(handle))),
        })
    }

    /// The LoRA adapter version its requests run through now (`None`: a model of its own).
    /// Every request a host builds for this key sets it as
    /// [`GenerationRequest::adapter`](crate::engine::GenerationRequest::adapter).
    pub fn adapter(&self) -> Option<AdapterHandle> {
        self.adapter.as_ref().map(|a| a.read().clone())
    }

    /// Replaces its adapter by the one in `dir` (a new version under its key): new requests
    /// run through it; requests on the old version finish on it (`drain`) or end now. The
    /// old version leaves the engine once none uses it. A refused adapter changes nothing.
    pub fn replace_adapter(&self, dir: &std::path::Path, drain: bool) -> Result<AdapterHandle> {
        let Some(cell) = &self.adapter else {
            return Err(Error::WeightUpdate(format!(
                "model `{}` is not an adapter",
                self.spec.key
            )));
        };
        let new = self
            .engine
            .load_adapter(&self.spec.key, dir)
            .map_err(|e| Error::WeightUpdate(e.to_string()))?;
        let old = std::mem::replace(&mut *cell.write(), new.clone());
        self.engine.retire_adapter(&old, drain).wait()?;
        Ok(new)
    }

    /// The spec it was loaded from.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }
    /// Where its files are.
    pub fn files(&self) -> &ModelFiles {
        &self.files
    }
    /// Its `config.json`.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    /// Its sampling defaults.
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }
    /// Its tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
    /// Its chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }
    /// Tokens that end generation (`<|im_end|>`, `<|endoftext|>` for Qwen3).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }
    /// The shared engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

fn eos_ids(
    gen_cfg: &GenerationConfig,
    config: &ModelConfig,
    files: &ModelFiles,
    tok: &Tokenizer,
) -> Vec<u32> {
    let mut ids = gen_cfg.eos_token_ids.clone();
    ids.extend(token_ids(config.eos_token_id.as_ref()));
    if let Ok(text) = std::fs::read_to_string(&files.tokenizer_config)
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
    {
        let special = crate::policy::format::special_tokens_of(&v);
        if let Some(eos) = special.get("eos_token").and_then(|v| v.as_str())
            && let Some(id) = tok.token_to_id(eos)
        {
            ids.push(id);
        }
    }
    if let Some(id) = tok.token_to_id("<|im_end|>") {
        ids.push(id);
    }
    let mut seen = Vec::new();
    ids.retain(|i| {
        let new = !seen.contains(i);
        seen.push(*i);
        new
    });
    ids
}

impl From<Arc<LoadedModel>> for crate::policy::PolicyModel {
    fn from(m: Arc<LoadedModel>) -> Self {
        Self::from(m.as_ref())
    }
}

impl From<&LoadedModel> for crate::policy::PolicyModel {
    fn from(m: &LoadedModel) -> Self {
        Self {
            key: m.spec.key.clone(),
            engine: m.engine.clone(),
            template: m.template.clone(),
            generation: m.generation.clone(),
            enable_thinking: m.spec.enable_thinking,
            adapter: m.adapter.clone(),
        }
    }
}
