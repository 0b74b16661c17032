//! LoRA adapters as PEFT writes them (`adapter_config.json` + `adapter_model.safetensors`),
//! read into host memory and checked against the base model: [`LoraAdapter::load`].
//!
//! Invariants: an adapter that loads is served exactly as PEFT computes it — every targeted
//! projection `W x` becomes `W x + s · B (A x)` with `s = lora_alpha / r` (or
//! `lora_alpha / sqrt(r)` with rsLoRA); the scale is folded into `B` here, once. Anything the
//! engine could not serve exactly (DoRA, embeddings or lm_head targeted, trained biases,
//! `fan_in_fan_out`, per-module alphas, a rank above the engine's limit, a shape that does
//! not match the base) is refused with an error naming the file and the tensor or key.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::config::ModelConfig;
use crate::engine::update::content_digest;
use crate::error::{Error, Result};

/// A projection of a decoder layer that an adapter may target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proj {
    /// `self_attn.q_proj`.
    Q,
    /// `self_attn.k_proj`.
    K,
    /// `self_attn.v_proj`.
    V,
    /// `self_attn.o_proj`.
    O,
    /// `mlp.gate_proj`.
    Gate,
    /// `mlp.up_proj`.
    Up,
    /// `mlp.down_proj`.
    Down,
}

impl Proj {
    /// Every projection, in the order of the fused groups (q, k, v | o | gate, up | down).
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    /// The module's name in HF checkpoints (`q_proj`).
    pub fn name(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
        }
    }

    fn parent(self) -> &'static str {
        match self {
            Proj::Q | Proj::K | Proj::V | Proj::O => "self_attn",
            _ => "mlp",
        }
    }

    /// `(in, out)` features of the projection in the model of `cfg`.
    pub fn dims(self, cfg: &ModelConfig) -> (usize, usize) {
        let (h, hd, inter) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
        match self {
            Proj::Q => (h, cfg.num_attention_heads * hd),
            Proj::K | Proj::V => (h, cfg.num_key_value_heads * hd),
            Proj::O => (cfg.num_attention_heads * hd, h),
            Proj::Gate | Proj::Up => (h, inter),
            Proj::Down => (inter, h),
        }
    }

    /// The fused matmul the projection is part of (0: qkv, 1: o, 2: gate|up, 3: down) and its
    /// place in it.
    pub fn group(self) -> (usize, usize) {
        match self {
            Proj::Q => (0, 0),
            Proj::K => (0, 1),
            Proj::V => (0, 2),
            Proj::O => (1, 0),
            Proj::Gate => (2, 0),
            Proj::Up => (2, 1),
            Proj::Down => (3, 0),
        }
    }

    fn from_name(name: &str) -> Option<Proj> {
        Proj::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// One targeted projection: `A` (`[rank, in]`) and `s · B` (`[out, rank]`), f32 row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraWeights {
    /// The rank of this projection's adapter.
    pub rank: usize,
    /// `lora_A`, `[rank, in]`.
    pub a: Vec<f32>,
    /// `lora_B` times the adapter's scale, `[out, rank]`.
    pub b: Vec<f32>,
}

/// A LoRA adapter in host memory, checked against a base model.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    /// The directory it was read from.
    pub dir: PathBuf,
    /// Digest of `adapter_config.json` and `adapter_model.safetensors` (16 hex digits).
    pub digest: String,
    /// The largest rank among its projections.
    pub rank: usize,
    /// Per decoder layer, per projection ([`Proj::ALL`] order): the adapter's weights, or
    /// `None` where it leaves the projection alone.
    pub layers: Vec<[Option<LoraWeights>; 7]>,
}

impl LoraAdapter {
    /// Reads the PEFT adapter in `dir` for a base model of `cfg`, refusing ranks above
    /// `max_rank` and anything it could not serve exactly (see the module docs).
    pub fn load(dir: &Path, cfg: &ModelConfig, max_rank: usize) -> Result<Self> {
        let config_path = dir.join("adapter_config.json");
        let weights_path = dir.join("adapter_model.safetensors");
        let bad = |file: &Path, reason: String| Error::Adapter {
            file: file.display().to_string(),
            reason,
        };
        if !config_path.is_file() {
            return Err(bad(
                dir,
                "no adapter_config.json here (a PEFT LoRA adapter directory is needed)".into(),
            ));
        }
        if !weights_path.is_file() {
            let why = if dir.join("adapter_model.bin").is_file() {
                "holds adapter_model.bin (pickle); save the adapter with safetensors (PEFT's default: `save_pretrained(dir)`)"
            } else {
                "no adapter_model.safetensors here"
            };
            return Err(bad(dir, why.into()));
        }
        let config_text = std::fs::read(&config_path).map_err(|e| Error::file(&config_path, e))?;
        let config: Value = serde_json::from_slice(&config_text)
            .map_err(|e| bad(&config_path, format!("not valid JSON: {e}")))?;
        let settings = Settings::parse(&config).map_err(|r| bad(&config_path, r))?;
        let bytes = std::fs::read(&weights_path).map_err(|e| Error::file(&weights_path, e))?;
        let digest = content_digest(&[
            (
                "adapter_config.json",
                DType::U8,
                &[config_text.len()],
                &config_text,
            ),
            (
                "adapter_model.safetensors",
                DType::U8,
                &[bytes.len()],
                &bytes,
            ),
        ]);
        let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
            .map_err(|e| bad(&weights_path, format!("not a valid safetensors file: {e}")))?;
        // Per layer and projection: lora_A and lora_B, with the names the file gives them.
        let mut pairs: Vec<[Option<(&str, Tensor)>; 2]> =
            vec![Default::default(); cfg.num_hidden_layers * 7];
        for (name, t) in &tensors {
            let (layer, proj, which) = parse_name(name, cfg.num_hidden_layers)
                .map_err(|r| bad(&weights_path, format!("tensor `{name}`: {r}")))?;
            pairs[layer * 7 + proj_index(proj)][which] = Some((name.as_str(), t.clone()));
        }
        let mut layers: Vec<[Option<LoraWeights>; 7]> = (0..cfg.num_hidden_layers)
            .map(|_| Default::default())
            .collect();
        let mut rank = 0;
        for (i, [a, b]) in pairs.into_iter().enumerate() {
            let layer = i / 7;
            let ((a_name, a), (b_name, b)) = match (a, b) {
                (None, None) => continue,
                (Some(a), Some(b)) => (a, b),
                (Some((has, _)), None) | (None, Some((has, _))) => {
                    let lacks = if has.contains("lora_A") {
                        has.replacen("lora_A", "lora_B", 1)
                    } else {
                        has.replacen("lora_B", "lora_A", 1)
                    };
                    return Err(bad(
                        &weights_path,
                        format!("tensor `{has}` has no `{lacks}` beside it"),
                    ));
                }
            };
            let proj = Proj::ALL[i % 7];
            let w = settings
                .weights(proj, cfg, &a, &b, max_rank)
                .map_err(|(on_b, r)| {
                    let at = if on_b { b_name } else { a_name };
                    bad(&weights_path, format!("tensor `{at}`: {r}"))
                })?;
            rank = rank.max(w.rank);
            layers[layer][i % 7] = Some(w);
        }
        if rank == 0 {
            return Err(bad(
                &weights_path,
                "holds no lora_A/lora_B pair of a decoder layer's projection".into(),
            ));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            digest,
            rank,
            layers,
        })
    }

    /// The projections it targets (module names, deduplicated, in [`Proj::ALL`] order).
    pub fn targets(&self) -> Vec<&'static str> {
        Proj::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| self.layers.iter().any(|l| l[*i].is_some()))
            .map(|(_, p)| p.name())
            .collect()
    }
}

fn proj_index(p: Proj) -> usize {
    Proj::ALL.iter().position(|&q| q == p).unwrap_or(0)
}

/// What `adapter_config.json` says that matters to the math.
struct Settings {
    r: usize,
    alpha: f64,
    rslora: bool,
    rank_pattern: bool,
}

impl Settings {
    fn parse(v: &Value) -> std::result::Result<Self, String> {
        if let Some(t) = v.get("peft_type").and_then(Value::as_str)
            && t != "LORA"
        {
            return Err(format!(
                "`peft_type` is {t:?}; only LoRA adapters (\"LORA\") are served"
            ));
        }
        if v.get("use_dora").and_then(Value::as_bool) == Some(true) {
            return Err("`use_dora` is true: DoRA adapters are not served (their magnitude vector rescales the merged weight per row, which a LoRA delta cannot express)".into());
        }
        if v.get("fan_in_fan_out").and_then(Value::as_bool) == Some(true) {
            return Err("`fan_in_fan_out` is true (transposed Conv1D weights); Qwen3 adapters store nn.Linear layouts".into());
        }
        match v.get("bias").and_then(Value::as_str) {
            None | Some("none") => {}
            Some(b) => {
                return Err(format!(
                    "`bias` is {b:?}: adapters that train biases are not served (only \"none\")"
                ));
            }
        }
        if let Some(m) = v.get("modules_to_save").and_then(Value::as_array)
            && !m.is_empty()
        {
            return Err(format!(
                "`modules_to_save` lists {m:?}: adapters that replace whole modules (embeddings, lm_head) are not served"
            ));
        }
        let refuse_targets = |t: &str| t.contains("embed_tokens") || t.contains("lm_head");
        match v.get("target_modules") {
            Some(Value::Array(ts)) => {
                if let Some(t) = ts
                    .iter()
                    .filter_map(Value::as_str)
                    .find(|t| refuse_targets(t))
                {
                    return Err(format!(
                        "`target_modules` names `{t}`: adapters on the embeddings or lm_head are not served (targets may be q/k/v/o/gate/up/down_proj)"
                    ));
                }
            }
            Some(Value::String(t)) if refuse_targets(t) => {
                return Err(format!(
                    "`target_modules` ({t:?}) matches the embeddings or lm_head, which are not served"
                ));
            }
            _ => {}
        }
        if let Some(p) = v.get("alpha_pattern").and_then(Value::as_object)
            && !p.is_empty()
        {
            return Err("`alpha_pattern` is not empty: per-module alphas are not served".into());
        }
        let r = v
            .get("r")
            .and_then(Value::as_u64)
            .filter(|r| *r > 0)
            .ok_or("`r` is missing or not a positive integer")? as usize;
        let alpha = match v.get("lora_alpha") {
            None | Some(Value::Null) => 8.0, // PEFT's default
            Some(a) => a
                .as_f64()
                .filter(|a| a.is_finite())
                .ok_or("`lora_alpha` is not a finite number")?,
        };
        Ok(Self {
            r,
            alpha,
            rslora: v.get("use_rslora").and_then(Value::as_bool) == Some(true),
            rank_pattern: v
                .get("rank_pattern")
                .and_then(Value::as_object)
                .is_some_and(|p| !p.is_empty()),
        })
    }

    /// One projection's checked weights, scale folded into `B`.
    fn weights(
        &self,
        proj: Proj,
        cfg: &ModelConfig,
        a: &Tensor,
        b: &Tensor,
        max_rank: usize,
    ) -> std::result::Result<LoraWeights, (bool, String)> {
        // An error says whether it is about lora_B (true) or lora_A.
        let on_a = |r: String| (false, r);
        let (fan_in, fan_out) = proj.dims(cfg);
        let (ad, bd) = (a.dims(), b.dims());
        let rank = match ad {
            [r, i] if *i == fan_in && *r > 0 => *r,
            _ => {
                return Err(on_a(format!(
                    "lora_A has shape {ad:?}; {} of this base takes [rank, {fan_in}]",
                    proj.name()
                )));
            }
        };
        if bd != [fan_out, rank] {
            return Err((
                true,
                format!(
                    "lora_B has shape {bd:?}; with lora_A's rank {rank} it must be [{fan_out}, {rank}]"
                ),
            ));
        }
        if rank > max_rank {
            return Err(on_a(format!(
                "rank {rank} is above this engine's --max-lora-rank {max_rank}"
            )));
        }
        if rank != self.r && !self.rank_pattern {
            return Err(on_a(format!(
                "rank {rank}, but adapter_config.json says r = {} (and has no rank_pattern)",
                self.r
            )));
        }
        for (t, on_b) in [(a, false), (b, true)] {
            if !matches!(
                t.dtype(),
                DType::F32 | DType::F16 | DType::BF16 | DType::F64
            ) {
                return Err((on_b, format!("dtype {:?}, not a float type", t.dtype())));
            }
        }
        let scale = if self.rslora {
            self.alpha / (rank as f64).sqrt()
        } else {
            self.alpha / rank as f64
        };
        let flat = |t: &Tensor, on_b: bool| -> std::result::Result<Vec<f32>, (bool, String)> {
            let v = t
                .to_dtype(DType::F32)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| (on_b, e.to_string()))?;
            match v.iter().find(|x| !x.is_finite()) {
                Some(bad) => Err((on_b, format!("holds a non-finite value ({bad})"))),
                None => Ok(v),
            }
        };
        let a = flat(a, false)?;
        let b: Vec<f32> = flat(b, true)?
            .into_iter()
            .map(|x| (x as f64 * scale) as f32)
            .collect();
        Ok(LoraWeights { rank, a, b })
    }
}

/// `(layer, projection, 0 for lora_A / 1 for lora_B)` of a PEFT tensor name, with or
/// without the `base_model.model.` prefix and the `.default` adapter name.
fn parse_name(name: &str, layers: usize) -> std::result::Result<(usize, Proj, usize), String> {
    if name.contains("lora_magnitude_vector") {
        return Err("a DoRA magnitude vector: DoRA adapters are not served".into());
    }
    if name.contains("embed_tokens") || name.contains("lm_head") || name.contains("lora_embedding")
    {
        return Err("targets the embeddings or lm_head, which are not served (targets may be q/k/v/o/gate/up/down_proj)".into());
    }
    let rest = name.strip_prefix("base_model.model.").unwrap_or(name);
    let unknown = || {
        "not a LoRA weight of a decoder layer's projection (expected `model.layers.N.self_attn|mlp.<proj>.lora_A|lora_B.weight`)".to_string()
    };
    let rest = rest.strip_prefix("model.layers.").ok_or_else(unknown)?;
    let parts: Vec<&str> = rest.split('.').collect();
    let parts: Vec<&str> = parts.into_iter().filter(|p| *p != "default").collect();
    let [layer, parent, proj, which, "weight"] = parts.as_slice() else {
        if name.ends_with(".bias") {
            return Err("a trained bias: adapters with biases are not served".into());
        }
        return Err(unknown());
    };
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    if layer >= layers {
        return Err(format!("layer {layer}, but the base has {layers} layers"));
    }
    let proj = Proj::from_name(proj).filter(|p| p.parent() == *parent);
    let Some(proj) = proj else {
        return Err(unknown());
    };
    let which = match *which {
        "lora_A" => 0,
        "lora_B" => 1,
        _ => return Err(unknown()),
    };
    Ok((layer, proj, which))
}
