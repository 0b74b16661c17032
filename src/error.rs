//! The crate's one error type.
//!
//! Every variant says what went wrong *and* what to do about it, so a host app can show the
//! message to a person as is. Callers match on the variant to react programmatically.

use std::path::PathBuf;

/// Shorthand for `std::result::Result<T, policy_serve::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in policy-serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `get_policy`/`spec` was asked for a key the registry does not hold.
    #[error(
        "unknown model key `{key}`; known keys: {known}. List them with `policy-serve models`."
    )]
    UnknownModel {
        /// The key that was asked for.
        key: String,
        /// The registry's keys, comma separated.
        known: String,
    },
    /// The model is listed but marked as not yet available ("coming soon").
    #[error(
        "model `{key}` ({label}) is listed as coming soon and cannot be loaded yet; pick another with `policy-serve models`"
    )]
    ModelUnavailable {
        /// The model's key.
        key: String,
        /// The model's label.
        label: String,
    },
    /// A model-only operation was asked of the demo entry (it has no weights or tokenizer).
    #[error("`{key}` is the scripted demo policy and has no {what}; use a model key for this")]
    DemoMisuse {
        /// The demo's key.
        key: String,
        /// What was asked for (for example "weights").
        what: &'static str,
    },
    /// Loading a model (files, tokenizer, config, weights) failed.
    #[error("failed to load model `{key}`: {reason}")]
    Load {
        /// The model's key.
        key: String,
        /// Why, with what to do.
        reason: String,
    },
    /// Downloading from the Hugging Face hub failed.
    #[error(
        "could not fetch `{file}` of `{repo}` (revision `{revision}`) from the Hugging Face hub: {reason}. If the files are on disk, point the spec at them with `ModelSource::Local(dir)` (CLI: `--model-dir DIR`); for the hub cache alone set HF_HUB_OFFLINE=1"
    )]
    Download {
        /// The hub repository.
        repo: String,
        /// The revision asked for.
        revision: String,
        /// The file that failed.
        file: String,
        /// The underlying error.
        reason: String,
    },
    /// A file could not be read or parsed.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A checkpoint is broken: missing tensor, wrong shape or dtype.
    #[error("bad checkpoint: tensor `{tensor}` in {file}: {reason}")]
    Checkpoint {
        /// Tensor name (HF naming).
        tensor: String,
        /// File that holds (or should hold) it.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A LoRA adapter the engine cannot serve exactly (DoRA, embeddings or lm_head targeted,
    /// a rank above the engine's limit, shapes that do not match the base) or a broken one.
    #[error("adapter {file}: {reason}")]
    Adapter {
        /// The file (or directory) at fault.
        file: String,
        /// What is wrong, naming the tensor or config key.
        reason: String,
    },
    /// The model's `config.json` describes something this crate cannot run.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// Rendering the chat template failed.
    #[error("chat template error: {0}")]
    Template(String),
    /// Tokenizing or detokenizing failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// A caller passed an invalid argument (bad tool schema, bad message, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A constraint (a tool's JSON schema, a response format, a grammar) that the grammar
    /// engine cannot compile; the message names what it refused.
    #[error("constraint refused: {0}")]
    Grammar(String),
    /// A prompt or request that can never fit the engine's limits.
    #[error("request too large: {0}")]
    TooLarge(String),
    /// A weight update was refused or failed before anything was written; the weights that
    /// served before keep serving.
    #[error("weight update refused: {0}; the previous weights keep serving")]
    WeightUpdate(String),
    /// The engine failed while running a request; other requests keep running.
    #[error("engine error: {0}")]
    Engine(String),
    /// The request was cancelled (its caller went away, or its episode was closed) before it
    /// finished; nothing of it was kept.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// The engine has shut down; no more requests are accepted.
    #[error("the engine has shut down; get a new policy from the registry")]
    EngineStopped,
    /// An error from candle (tensor ops, device).
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// An I/O error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A JSON error.
    #[error("json error: {0}")]
    Json(#[from] serde_json::Error),
}

impl Error {
    /// This error as a failure to load model `key`: an error that already says so (a load,
    /// checkpoint or unsupported-model error) as it is, anything else wrapped once in
    /// [`Error::Load`].
    pub(crate) fn loading(self, key: &str) -> Error {
        match self {
            e @ (Error::Load { .. }
            | Error::Checkpoint { .. }
            | Error::Adapter { .. }
            | Error::Unsupported(_)) => e,
            other => Error::Load {
                key: key.into(),
                reason: other.to_string(),
            },
        }
    }

    pub(crate) fn file(path: impl Into<PathBuf>, reason: impl std::fmt::Display) -> Self {
        Error::File {
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}

/// An engine error naming the CUDA kernel step that failed (`engine::cuda`: its launches, and
/// the block timeline below them).
#[cfg(feature = "cuda")]
pub(crate) fn kernel_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Engine(format!("CUDA kernel {what}: {e}"))
}
