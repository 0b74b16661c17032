//! The model registry: an ordered set of selectable models (the demo first and default), each
//! loaded at most once per process, handing out a fresh policy per episode.
//!
//! Invariants: one `OnceCell` per key, so concurrent first calls wait for a single load; a
//! failed load is not cached (the next call tries again); `get_policy` is cheap after the load.

mod loaded;
mod source;
mod spec;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use once_cell::sync::OnceCell;

pub use crate::engine::model::files::{ModelFiles, shard_names};
pub use loaded::LoadedModel;
pub use source::resolve as resolve_files;
pub use spec::{ModelSource, ModelSpec};

use crate::engine::EngineOptions;
use crate::error::{Error, Result};
use crate::policy::{DemoPolicy, EpisodeConfig, ModelPolicy, Policy};

struct Entry {
    spec: ModelSpec,
    cell: OnceCell<Arc<LoadedModel>>,
    load_attempts: AtomicUsize,
    /// The last failed load: when, and the error's text.
    last_failure: parking_lot::Mutex<Option<(std::time::Instant, String)>>,
}

/// The set of selectable models. Share it (`Arc<ModelRegistry>`) across threads.
pub struct ModelRegistry {
    entries: Vec<Entry>,
    options: EngineOptions,
    load_backoff: std::time::Duration,
}

impl std::fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| &e.spec.key))
            .finish()
    }
}

/// Suffix of an unavailable model's label in [`ModelRegistry::choices`].
pub const COMING_SOON: &str = " — coming soon";

impl ModelRegistry {
    /// A registry of these specs, in order; the first is the default. Keys must be unique
    /// and non-empty.
    pub fn new(specs: Vec<ModelSpec>) -> Result<Self> {
        let mut entries: Vec<Entry> = Vec::with_capacity(specs.len());
        for spec in specs {
            if spec.key.trim().is_empty() {
                return Err(Error::InvalidInput("a model spec has an empty key".into()));
            }
            if entries.iter().any(|e| e.spec.key == spec.key) {
                return Err(Error::InvalidInput(format!(
                    "model key `{}` is listed twice",
                    spec.key
                )));
            }
            entries.push(Entry {
                spec,
                cell: OnceCell::new(),
                load_attempts: AtomicUsize::new(0),
                last_failure: parking_lot::Mutex::new(None),
            });
        }
        if entries.is_empty() {
            return Err(Error::InvalidInput(
                "a registry needs at least one model".into(),
            ));
        }
        Ok(Self {
            entries,
            options: EngineOptions::default(),
            load_backoff: std::time::Duration::ZERO,
        })
    }

    /// The reference registry: the demo (default), Qwen3-0.6B, Qwen3-1.7B, the fine-tuned
    /// Qwen3-1.7B SQL agent and the Qwen3-30B-A3B mixture of experts, all with
    /// `enable_thinking = false`.
    pub fn with_defaults() -> Self {
        Self::new(vec![
            ModelSpec::demo(),
            ModelSpec::hub("qwen3-0.6b", "Qwen3 0.6B", "Qwen/Qwen3-0.6B", "main"),
            ModelSpec::hub("qwen3-1.7b", "Qwen3 1.7B", "Qwen/Qwen3-1.7B", "main"),
            ModelSpec::hub(
                "sqlenv-qwen3-1.7b-grpo",
                "Qwen3 1.7B SQL agent (GRPO fine-tune)",
                "hjerpe/sqlenv-qwen3-1.7b-grpo-v2",
                "main",
            ),
            ModelSpec::hub(
                "qwen3-30b-a3b",
                "Qwen3 30B-A3B (MoE)",
                "Qwen/Qwen3-30B-A3B",
                "main",
            ),
        ])
        .expect("the default specs are valid")
    }

    /// How models are loaded and served (the options of [`Self::with_options`]).
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Sets how models are loaded and served (device, dtype, batching, cache). Applies to
    /// models loaded after this call.
    pub fn with_options(mut self, options: EngineOptions) -> Self {
        self.options = options;
        self
    }

    /// After a failed load, calls within `backoff` fail at once with the same reason instead
    /// of loading again (a broken checkpoint under load does not reload per request). Zero (the
    /// default): every call after a failure tries again.
    pub fn with_load_backoff(mut self, backoff: std::time::Duration) -> Self {
        self.load_backoff = backoff;
        self
    }

    /// Adds a spec at the end, or replaces the one with the same key (keeping its position).
    pub fn with_model(mut self, spec: ModelSpec) -> Self {
        let entry = Entry {
            spec,
            cell: OnceCell::new(),
            load_attempts: AtomicUsize::new(0),
            last_failure: parking_lot::Mutex::new(None),
        };
        match self
            .entries
            .iter()
            .position(|e| e.spec.key == entry.spec.key)
        {
            Some(i) => self.entries[i] = entry,
            None => self.entries.push(entry),
        }
        self
    }

    /// Points an existing key at a local directory (for example after downloading by hand).
    pub fn with_local_dir(self, key: &str, dir: impl Into<PathBuf>) -> Result<Self> {
        let mut spec = self.spec(key)?.clone();
        spec.source = ModelSource::Local(dir.into());
        Ok(self.with_model(spec))
    }

    /// The default key (the first spec, the demo in the reference registry).
    pub fn default_key(&self) -> &str {
        &self.entries[0].spec.key
    }

    /// Every spec, in order.
    pub fn specs(&self) -> impl Iterator<Item = &ModelSpec> {
        self.entries.iter().map(|e| &e.spec)
    }

    /// (label, key) pairs for a picker, unavailable ones suffixed " — coming soon".
    pub fn choices(&self) -> Vec<(String, String)> {
        self.specs()
            .map(|s| {
                let label = if s.available {
                    s.label.clone()
                } else {
                    format!("{}{COMING_SOON}", s.label)
                };
                (label, s.key.clone())
            })
            .collect()
    }

    fn entry(&self, key: &str) -> Result<&Entry> {
        self.entries
            .iter()
            .find(|e| e.spec.key == key)
            .ok_or_else(|| Error::UnknownModel {
                key: key.to_string(),
                known: self
                    .entries
                    .iter()
                    .map(|e| e.spec.key.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The spec of a key.
    pub fn spec(&self, key: &str) -> Result<&ModelSpec> {
        self.entry(key).map(|e| &e.spec)
    }

    /// The loaded model of a key, loading it on first use (at most once per process; a
    /// failure is returned and not cached).
    pub fn model(&self, key: &str) -> Result<Arc<LoadedModel>> {
        let entry = self.entry(key)?;
        let spec = &entry.spec;
        if spec.is_demo() {
            return Err(Error::DemoMisuse {
                key: key.to_string(),
                what: "weights or tokenizer",
            });
        }
        if !spec.available {
            return Err(Error::ModelUnavailable {
                key: key.to_string(),
                label: spec.label.clone(),
            });
        }
        let recent_failure = || {
            let last = entry.last_failure.lock();
            last.as_ref()
                .filter(|(at, _)| at.elapsed() < self.load_backoff)
                .map(|(at, reason)| Error::Load {
                    key: key.to_string(),
                    reason: format!(
                        "{reason} (failed {:.0} s ago; the next attempt comes after a back-off of {} s)",
                        at.elapsed().as_secs_f64(),
                        self.load_backoff.as_secs()
                    ),
                })
        };
        if let Some(e) = recent_failure() {
            return Err(e);
        }
        entry
            .cell
            .get_or_try_init(|| {
                // Callers that waited for a load that failed see its failure, not a new load.
                if let Some(e) = recent_failure() {
                    return Err(e);
                }
                entry.load_attempts.fetch_add(1, Ordering::SeqCst);
                tracing::info!(model = key, source = %spec.source, "loading model");
                let loaded = match &spec.adapter_of {
                    Some(base) => self
                        .base_of(key, base)
                        .and_then(|b| LoadedModel::load_adapter(spec, &b)),
                    None => LoadedModel::load(spec, &self.options_for(key)),
                };
                loaded.map(Arc::new).inspect_err(|e| {
                    *entry.last_failure.lock() = Some((std::time::Instant::now(), e.to_string()));
                })
            })
            .cloned()
    }

    /// The loaded base of adapter key `key`.
    fn base_of(&self, key: &str, base: &str) -> Result<Arc<LoadedModel>> {
        let spec = self.spec(base)?;
        if spec.adapter_of.is_some() || spec.is_demo() {
            return Err(Error::InvalidInput(format!(
                "adapter `{key}` names `{base}` as its base, which is not a model of its own"
            )));
        }
        self.model(base)
    }

    /// The options `key` loads with: the registry's, with LoRA slots reserved
    /// (`EngineOptions::lora`, defaults unless set) when an adapter key names it as its base.
    fn options_for(&self, key: &str) -> EngineOptions {
        let mut opts = self.options.clone();
        if self.specs().any(|s| s.adapter_of.as_deref() == Some(key)) {
            opts.lora.get_or_insert_with(Default::default);
        }
        opts
    }

    /// Whether a key's model is loaded.
    pub fn is_loaded(&self, key: &str) -> bool {
        self.entry(key)
            .map(|e| e.cell.get().is_some())
            .unwrap_or(false)
    }

    /// How many times loading a key was attempted (successful or not) in this process.
    pub fn load_attempts(&self, key: &str) -> usize {
        self.entry(key)
            .map(|e| e.load_attempts.load(Ordering::SeqCst))
            .unwrap_or(0)
    }

    /// A fresh policy for one episode of `key`: the demo, or a model policy sharing the
    /// model's weights and engine (loaded on first use).
    pub fn get_policy(&self, key: &str, episode: EpisodeConfig) -> Result<Box<dyn Policy>> {
        let spec = self.spec(key)?;
        if !spec.available {
            return Err(Error::ModelUnavailable {
                key: key.to_string(),
                label: spec.label.clone(),
            });
        }
        if spec.is_demo() {
            return Ok(Box::new(DemoPolicy::new(key, &episode)));
        }
        let model = self.model(key)?;
        Ok(Box::new(ModelPolicy::new(model, episode)?))
    }

    /// Replaces the weights of `key`'s loaded model in place (see
    /// [`Engine::update_weights`](crate::engine::Engine::update_weights)): policies already
    /// handed out keep working and sample from the new weights once their running requests
    /// have finished on the old ones (`drain`) or were ended (`!drain`). Blocks until the
    /// update is applied or refused; a refused update leaves the old weights serving. The
    /// model must be loaded (an update of a model nobody uses is a fresh load: point the spec
    /// at the new files instead).
    ///
    /// For an adapter key (`ModelSpec::adapter`) `source` is a directory holding the
    /// adapter's new version: it is checked, new requests run through it, requests on the old
    /// version finish on it (or end, `!drain`), and the base serves on untouched.
    pub fn update_weights(
        &self,
        key: &str,
        source: crate::engine::WeightSource,
        drain: bool,
    ) -> Result<crate::engine::WeightsVersion> {
        let entry = self.entry(key)?;
        if entry.spec.is_demo() {
            return Err(Error::DemoMisuse {
                key: key.to_string(),
                what: "weights",
            });
        }
        let Some(model) = entry.cell.get() else {
            return Err(Error::WeightUpdate(format!(
                "model `{key}` is not loaded; load it first (get_policy) or point its spec at the new files"
            )));
        };
        if model.adapter().is_some() {
            // An adapter key: a new adapter version, the base untouched.
            let crate::engine::WeightSource::Dir(dir) = source else {
                return Err(Error::WeightUpdate(format!(
                    "`{key}` is a LoRA adapter: give a directory with adapter_config.json and adapter_model.safetensors (WeightSource::Dir)"
                )));
            };
            let new = model.replace_adapter(&dir, drain)?;
            return Ok(crate::engine::WeightsVersion {
                adapter: Some(new.version().clone()),
                ..model.engine().stats().weights_version
            });
        }
        model.engine().update_weights(source, drain).wait()
    }

    /// Loads every available model, logging and skipping failures; returns the keys loaded.
    pub fn preload_available(&self) -> Vec<String> {
        let mut loaded = Vec::new();
        for spec in self.specs().filter(|s| s.available && !s.is_demo()) {
            match self.model(&spec.key) {
                Ok(_) => loaded.push(spec.key.clone()),
                Err(e) => tracing::warn!(model = %spec.key, error = %e, "preload failed; skipping"),
            }
        }
        loaded
    }
}
