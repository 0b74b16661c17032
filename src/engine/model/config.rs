//! Model and generation configs from HF's `config.json` / `generation_config.json`, and the
//! capability predicates that gate the KV-only prefix cache and swap.
//!
//! The predicates are decided by architecture in one table ([`ARCHITECTURES`]): a model whose
//! per-sequence state lives only in the attention KV can have its KV blocks shared, evicted and
//! swapped; hybrids with linear-attention/SSM state cannot.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// One row of the architecture table.
#[derive(Debug, Clone, Copy)]
pub struct Architecture {
    /// HF `model_type`.
    pub model_type: &'static str,
    /// Whether this crate can run it.
    pub supported: bool,
    /// All per-sequence state is in the attention KV (no recurrent/SSM state).
    pub state_is_kv_only: bool,
    /// Why the state is not KV-only, for the warning.
    pub note: &'static str,
}

/// Known architectures. `qwen3` and `qwen3_moe` run; the others are listed so that the cache
/// and swap gates answer correctly (and say why) when they are added.
pub const ARCHITECTURES: &[Architecture] = &[
    Architecture {
        model_type: "qwen3",
        supported: true,
        state_is_kv_only: true,
        note: "",
    },
    Architecture {
        model_type: "qwen3_moe",
        supported: true,
        state_is_kv_only: true,
        note: "",
    },
    Architecture {
        model_type: "qwen3_next",
        supported: false,
        state_is_kv_only: false,
        note: "its gated-DeltaNet linear-attention layers keep recurrent state outside the KV cache",
    },
    Architecture {
        model_type: "jamba",
        supported: false,
        state_is_kv_only: false,
        note: "its Mamba layers keep SSM state outside the KV cache",
    },
    Architecture {
        model_type: "falcon_h1",
        supported: false,
        state_is_kv_only: false,
        note: "its Mamba-2 heads keep SSM state outside the KV cache",
    },
    Architecture {
        model_type: "mamba",
        supported: false,
        state_is_kv_only: false,
        note: "it is a state-space model with no KV cache",
    },
];

/// A Qwen3 or Qwen3-MoE `config.json` (the MoE fields default to a dense model).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ModelConfig {
    /// HF `model_type`.
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// KV heads (GQA).
    pub num_key_value_heads: usize,
    /// Per-head dimension.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Max positions.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// RoPE base.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// lm_head shares the embedding matrix.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias.
    #[serde(default)]
    pub attention_bias: bool,
    /// Activation (`silu`).
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Checkpoint dtype (`bfloat16`, ...), if given.
    #[serde(default)]
    pub torch_dtype: Option<String>,
    /// `eos_token_id` of the config (int or list).
    #[serde(default)]
    pub eos_token_id: Option<Value>,
    /// MoE: routed experts per sparse layer (0: a dense model).
    #[serde(default)]
    pub num_experts: usize,
    /// MoE: experts each token is routed to (top-k).
    #[serde(default)]
    pub num_experts_per_tok: usize,
    /// MoE: each expert's MLP inner size.
    #[serde(default)]
    pub moe_intermediate_size: usize,
    /// MoE: the top-k routing weights are renormalized to sum to 1 (HF's default: false).
    #[serde(default)]
    pub norm_topk_prob: bool,
    /// MoE: every `decoder_sparse_step`-th layer is sparse (layer `i` when `(i + 1) %
    /// step == 0`).
    #[serde(default = "default_sparse_step")]
    pub decoder_sparse_step: usize,
    /// MoE: layers that keep a dense MLP (of `intermediate_size`) whatever the step says.
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
}

fn default_sparse_step() -> usize {
    1
}

fn default_max_pos() -> usize {
    40_960
}
fn default_rope_theta() -> f64 {
    1_000_000.0
}
fn default_eps() -> f64 {
    1e-6
}
fn default_act() -> String {
    "silu".into()
}

impl ModelConfig {
    /// Reads and checks a `config.json`; an unsupported `model_type` is refused with the list
    /// of supported ones.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, e))?;
        Self::from_json(&text).map_err(|e| match e {
            Error::InvalidInput(r) => Error::file(path, r),
            other => other,
        })
    }

    /// Parses and checks a `config.json` text.
    pub fn from_json(text: &str) -> Result<Self> {
        let mut raw: Value = serde_json::from_str(text)
            .map_err(|e| Error::InvalidInput(format!("config.json is not valid JSON: {e}")))?;
        moe_aliases(&mut raw);
        let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or("");
        let supported: Vec<&str> = ARCHITECTURES
            .iter()
            .filter(|a| a.supported)
            .map(|a| a.model_type)
            .collect();
        if !supported.contains(&model_type) {
            return Err(Error::Unsupported(format!(
                "model_type `{model_type}` is not supported; supported: {}",
                supported.join(", ")
            )));
        }
        let cfg: Self = serde_json::from_value(raw).map_err(|e| {
            Error::InvalidInput(format!("config.json does not describe a Qwen3 model: {e}"))
        })?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidInput(format!("config.json: {m}")));
        // Sane bounds before anything is sized from the config (no allocation, no overflow).
        for (name, value, max) in [
            ("vocab_size", self.vocab_size, 1usize << 24),
            ("hidden_size", self.hidden_size, 1 << 17),
            ("intermediate_size", self.intermediate_size, 1 << 20),
            ("num_hidden_layers", self.num_hidden_layers, 1 << 12),
            ("num_attention_heads", self.num_attention_heads, 1 << 12),
            ("num_key_value_heads", self.num_key_value_heads, 1 << 12),
            ("head_dim", self.head_dim.unwrap_or(1), 1 << 12),
        ] {
            if value == 0 || value > max {
                return bad(format!(
                    "{name} = {value} is outside 1..={max}; this is not a checkpoint this engine can serve"
                ));
            }
        }
        if self.max_position_embeddings == 0 {
            return bad("max_position_embeddings must be positive".into());
        }
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(self.rope_theta) || !positive(self.rms_norm_eps) {
            return bad("rope_theta and rms_norm_eps must be positive numbers".into());
        }
        if self.num_attention_heads == 0
            || self.num_key_value_heads == 0
            || self.num_hidden_layers == 0
        {
            return bad("head and layer counts must be positive".into());
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.hidden_act != "silu" {
            return bad(format!(
                "hidden_act `{}` is not supported (only silu)",
                self.hidden_act
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "head_dim {} must be even for RoPE",
                self.head_dim()
            ));
        }
        self.check_moe()
    }

    /// The MoE fields: absent for `qwen3`; for `qwen3_moe` an expert count, a top-k within
    /// it, an expert size and a positive sparse step.
    fn check_moe(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidInput(format!("config.json: {m}")));
        if self.model_type != "qwen3_moe" {
            if self.num_experts > 0 {
                return bad(format!(
                    "num_experts = {} in a `{}` config; an MoE checkpoint has model_type qwen3_moe",
                    self.num_experts, self.model_type
                ));
            }
            return Ok(());
        }
        for (name, value, max) in [
            ("num_experts", self.num_experts, 1usize << 12),
            ("num_experts_per_tok", self.num_experts_per_tok, 1 << 12),
            ("moe_intermediate_size", self.moe_intermediate_size, 1 << 20),
            ("decoder_sparse_step", self.decoder_sparse_step, 1 << 12),
        ] {
            if value == 0 || value > max {
                return bad(format!(
                    "{name} = {value} is outside 1..={max} in a qwen3_moe config"
                ));
            }
        }
        if self.num_experts_per_tok > self.num_experts {
            return bad(format!(
                "num_experts_per_tok ({}) exceeds num_experts ({})",
                self.num_experts_per_tok, self.num_experts
            ));
        }
        if let Some(l) = self
            .mlp_only_layers
            .iter()
            .find(|&&l| l >= self.num_hidden_layers)
        {
            return bad(format!(
                "mlp_only_layers names layer {l} of a model with {} layers",
                self.num_hidden_layers
            ));
        }
        Ok(())
    }

    /// Whether this is a mixture-of-experts model (some layers route tokens to experts).
    pub fn is_moe(&self) -> bool {
        self.num_experts > 0 && (0..self.num_hidden_layers).any(|l| self.is_sparse_layer(l))
    }

    /// Whether layer `layer` is a sparse (MoE) layer, as transformers' `Qwen3MoeDecoderLayer`
    /// decides: not in `mlp_only_layers`, experts configured, and `(layer + 1)` a multiple of
    /// `decoder_sparse_step`.
    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && (layer + 1).is_multiple_of(self.decoder_sparse_step.max(1))
    }

    /// Per-head dimension (`head_dim`, else hidden/heads).
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    fn architecture(&self) -> Option<&'static Architecture> {
        ARCHITECTURES
            .iter()
            .find(|a| a.model_type == self.model_type)
    }

    /// True when every per-sequence state lives in the attention KV, so cached KV blocks of a
    /// prefix can be shared between sequences.
    pub fn kv_only_prefix_cache_is_safe(&self) -> bool {
        self.architecture().is_some_and(|a| a.state_is_kv_only)
    }

    /// True when swapping a sequence's KV blocks out to host memory and back restores it fully.
    pub fn kv_only_swap_out_is_safe(&self) -> bool {
        self.architecture().is_some_and(|a| a.state_is_kv_only)
    }

    /// Why the KV-only predicates are false (empty when they hold).
    pub fn kv_only_reason(&self) -> &'static str {
        self.architecture()
            .map(|a| a.note)
            .unwrap_or("unknown architecture")
    }

    /// The fields that fix the weights' names and shapes, as `field = value` pairs.
    pub fn shape_summary(&self) -> String {
        let moe = if self.num_experts > 0 {
            format!(
                ", num_experts = {}, num_experts_per_tok = {}, moe_intermediate_size = {}, decoder_sparse_step = {}, mlp_only_layers = {:?}",
                self.num_experts,
                self.num_experts_per_tok,
                self.moe_intermediate_size,
                self.decoder_sparse_step,
                self.mlp_only_layers
            )
        } else {
            String::new()
        };
        format!(
            "model_type = {}, vocab_size = {}, hidden_size = {}, intermediate_size = {}, num_hidden_layers = {}, num_attention_heads = {}, num_key_value_heads = {}, head_dim = {}, attention_bias = {}{moe}",
            self.model_type,
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim(),
            self.attention_bias
        )
    }

    /// Whether `other` describes weights of the same names and shapes (a fine-tune of this
    /// model, say).
    pub fn same_shapes(&self, other: &ModelConfig) -> bool {
        self.shape_summary() == other.shape_summary()
    }

    /// Bytes of KV per token per layer-set (K and V, all layers) at `dtype_bytes`.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> usize {
        2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim() * dtype_bytes
    }
}

/// The MoE fields under the names other writers give them: transformers 5 saves a Qwen3-MoE
/// config's expert count as `num_local_experts` (its MoE-wide name), other converters as
/// `n_routed_experts`; the canonical key wins when both are present.
fn moe_aliases(raw: &mut Value) {
    let Some(obj) = raw.as_object_mut() else {
        return;
    };
    for (key, aliases) in [
        (
            "num_experts",
            &["num_local_experts", "n_routed_experts"][..],
        ),
        ("num_experts_per_tok", &["top_k", "moe_topk"][..]),
    ] {
        let missing = obj
            .get(key)
            .is_none_or(|v| v.is_null() || v.as_u64() == Some(0));
        if !missing {
            continue;
        }
        if let Some(v) = aliases
            .iter()
            .filter_map(|a| obj.get(*a))
            .find(|v| v.as_u64().is_some_and(|n| n > 0))
            .cloned()
        {
            obj.insert(key.to_string(), v);
        }
    }
}

/// Sampling defaults of a model (`generation_config.json`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerationConfig {
    /// Default temperature (`None`: greedy unless asked).
    pub temperature: Option<f32>,
    /// Default top-k.
    pub top_k: Option<usize>,
    /// Default top-p.
    pub top_p: Option<f32>,
    /// Whether sampling is on by default.
    pub do_sample: bool,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
}

impl GenerationConfig {
    /// Reads a `generation_config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, e))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Error::file(path, format!("not valid JSON: {e}")))?;
        Ok(Self {
            temperature: v
                .get("temperature")
                .and_then(Value::as_f64)
                .map(|t| t as f32),
            top_k: v.get("top_k").and_then(Value::as_u64).map(|k| k as usize),
            top_p: v.get("top_p").and_then(Value::as_f64).map(|p| p as f32),
            do_sample: v.get("do_sample").and_then(Value::as_bool).unwrap_or(false),
            eos_token_ids: token_ids(v.get("eos_token_id")),
        })
    }
}

/// `eos_token_id` as HF writes it: an int or a list of ints.
pub fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| n as u32)
            .collect(),
        _ => vec![],
    }
}
