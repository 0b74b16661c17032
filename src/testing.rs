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

/// Writes a PEFT LoRA adapter of `rank` on all seven projections of every layer of the model
/// of `cfg` to `dir` (A and B drawn N(0, `std`) by candle, stored bf16; `lora_alpha` = 2 ·
/// rank): what the benchmarks and the GPU checks serve.
pub fn write_random_adapter(
    dir: &std::path::Path,
    cfg: &ModelConfig,
    rank: usize,
    std: f32,
) -> crate::Result<()> {
    use crate::engine::model::lora::Proj;
    use candle_core::{DType, Device, Tensor};
    std::fs::create_dir_all(dir)?;
    let mut t = std::collections::HashMap::new();
    for l in 0..cfg.num_hidden_layers {
        for p in Proj::ALL {
            let (fan_in, fan_out) = p.dims(cfg);
            let parent = if matches!(p, Proj::Q | Proj::K | Proj::V | Proj::O) {
                "self_attn"
            } else {
                "mlp"
            };
            let name = format!("base_model.model.model.layers.{l}.{parent}.{}", p.name());
            let a = Tensor::randn(0f32, std, (rank, fan_in), &Device::Cpu)?;
            let b = Tensor::randn(0f32, std, (fan_out, rank), &Device::Cpu)?;
            t.insert(format!("{name}.lora_A.weight"), a.to_dtype(DType::BF16)?);
            t.insert(format!("{name}.lora_B.weight"), b.to_dtype(DType::BF16)?);
        }
    }
    let config = serde_json::json!({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
        "target_modules": Proj::ALL.iter().map(|p| p.name()).collect::<Vec<_>>(),
        "use_dora": false, "use_rslora": false, "task_type": "CAUSAL_LM"
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string())?;
    candle_core::safetensors::save(&t, dir.join("adapter_model.safetensors"))?;
    Ok(())
}
