//! Fixtures shared by the tests and the benchmarks: synthetic prompts and the tensor list of a
//! Qwen3 checkpoint (for writing random checkpoints in the real layout). Not for serving.

use crate::engine::ModelConfig;

/// How a random checkpoint initializes a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorRole {
    /// The token embedding `[vocab, hidden]`.
    Embedding,
    /// A projection `[out, in]` (fan-in is `shape[1]`).
    Matrix,
    /// An RMSNorm weight `[n]` (around 1).
    Norm,
}

/// One tensor of a checkpoint: HF name, shape, role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// HF tensor name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// How to initialize it.
    pub role: TensorRole,
}

/// Every tensor of a Qwen3 checkpoint for `cfg`, in a fixed order: the embedding, then per
/// layer q/k/v/o, q/k norms, gate/up/down, the two layer norms, then the final norm, and
/// `lm_head.weight` last when the config does not tie it to the embedding (Qwen3-8B and up).
pub fn qwen3_tensor_specs(cfg: &ModelConfig) -> Vec<TensorSpec> {
    crate::engine::model::update::weight_table(cfg, cfg.tie_word_embeddings)
        .into_iter()
        .map(|(name, shape)| {
            let role = if name == "model.embed_tokens.weight" {
                TensorRole::Embedding
            } else if shape.len() == 1 {
                TensorRole::Norm
            } else {
                TensorRole::Matrix
            };
            TensorSpec { name, shape, role }
        })
        .collect()
}

/// A deterministic synthetic prompt of `n` token ids (all below 150,000), different per `salt`.
pub fn synthetic_prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729) % 150_000) as u32)
        .collect()
}
