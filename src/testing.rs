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
    let (v, h, i) = (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size);
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    );
    let spec = |name: String, shape: Vec<usize>, role| TensorSpec { name, shape, role };
    let mut out = vec![spec(
        "model.embed_tokens.weight".into(),
        vec![v, h],
        TensorRole::Embedding,
    )];
    for li in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{li}");
        let m = |n: &str, shape: Vec<usize>| spec(format!("{p}.{n}"), shape, TensorRole::Matrix);
        let norm = |n: &str, size: usize| spec(format!("{p}.{n}"), vec![size], TensorRole::Norm);
        out.extend([
            m("self_attn.q_proj.weight", vec![nh * hd, h]),
            m("self_attn.k_proj.weight", vec![nkv * hd, h]),
            m("self_attn.v_proj.weight", vec![nkv * hd, h]),
            m("self_attn.o_proj.weight", vec![h, nh * hd]),
            norm("self_attn.q_norm.weight", hd),
            norm("self_attn.k_norm.weight", hd),
            m("mlp.gate_proj.weight", vec![i, h]),
            m("mlp.up_proj.weight", vec![i, h]),
            m("mlp.down_proj.weight", vec![h, i]),
            norm("input_layernorm.weight", h),
            norm("post_attention_layernorm.weight", h),
        ]);
    }
    out.push(spec("model.norm.weight".into(), vec![h], TensorRole::Norm));
    if !cfg.tie_word_embeddings {
        out.push(spec(
            "lm_head.weight".into(),
            vec![v, h],
            TensorRole::Matrix,
        ));
    }
    out
}

/// A deterministic synthetic prompt of `n` token ids (all below 150,000), different per `salt`.
pub fn synthetic_prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729) % 150_000) as u32)
        .collect()
}
