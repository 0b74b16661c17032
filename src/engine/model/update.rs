//! Weights replaced in place: an HF tensor name mapped onto the loaded model's tensors (the
//! same fusions, tensor-parallel slices and folded scales the loader applies), written into
//! the existing device buffers so that nothing else (CUDA graphs, kernels) sees a new pointer.
//!
//! Invariants: [`Qwen3::set_weight`] leaves the model exactly as [`Qwen3::load`] would have
//! built it from a checkpoint holding that tensor (bit for bit); a name or shape the model
//! does not have is refused before anything is written ([`check_tensor`]), so callers check a
//! whole update first and write only once every tensor passed.

use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;
use super::qwen3::Qwen3;
use super::weights::Checkpoint;
use crate::error::{Error, Result};

/// One part of a decoder layer, as HF names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    O,
    Gate,
    Up,
    Down,
    InputNorm,
    PostNorm,
    /// MoE: the router `mlp.gate.weight`.
    Router,
    /// MoE: expert `e`'s `gate_proj`.
    ExpertGate(usize),
    /// MoE: expert `e`'s `up_proj`.
    ExpertUp(usize),
    /// MoE: expert `e`'s `down_proj`.
    ExpertDown(usize),
    /// MoE, transformers 5's stacked layout: `mlp.experts.gate_up_proj` `[E, 2I, hidden]`.
    ExpertsGateUp,
    /// MoE, stacked: `mlp.experts.down_proj` `[E, hidden, I]`.
    ExpertsDown,
}

/// Where an HF tensor lives in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Embed,
    LmHead,
    Norm,
    Layer(usize, Part),
}

/// A decoder layer's tensors in the order a checkpoint lists them (the biases, which Qwen3
/// lacks, last).
const LAYER_PARTS: [(&str, Part); 14] = [
    ("self_attn.q_proj.weight", Part::Q),
    ("self_attn.k_proj.weight", Part::K),
    ("self_attn.v_proj.weight", Part::V),
    ("self_attn.o_proj.weight", Part::O),
    ("self_attn.q_norm.weight", Part::QNorm),
    ("self_attn.k_norm.weight", Part::KNorm),
    ("mlp.gate_proj.weight", Part::Gate),
    ("mlp.up_proj.weight", Part::Up),
    ("mlp.down_proj.weight", Part::Down),
    ("input_layernorm.weight", Part::InputNorm),
    ("post_attention_layernorm.weight", Part::PostNorm),
    ("self_attn.q_proj.bias", Part::QBias),
    ("self_attn.k_proj.bias", Part::KBias),
    ("self_attn.v_proj.bias", Part::VBias),
];

/// A sparse layer's tensors, expert by expert (the published checkpoints' layout).
fn sparse_parts(cfg: &ModelConfig) -> Vec<(String, Part)> {
    let mut t = vec![("mlp.gate.weight".to_string(), Part::Router)];
    for e in 0..cfg.num_experts {
        t.push((
            format!("mlp.experts.{e}.gate_proj.weight"),
            Part::ExpertGate(e),
        ));
        t.push((format!("mlp.experts.{e}.up_proj.weight"), Part::ExpertUp(e)));
        t.push((
            format!("mlp.experts.{e}.down_proj.weight"),
            Part::ExpertDown(e),
        ));
    }
    t
}

/// Parses a sparse layer's tensor name (either layout).
fn sparse_part(cfg: &ModelConfig, name: &str) -> Option<Part> {
    match name {
        "mlp.gate.weight" => return Some(Part::Router),
        "mlp.experts.gate_up_proj" => return Some(Part::ExpertsGateUp),
        "mlp.experts.down_proj" => return Some(Part::ExpertsDown),
        _ => {}
    }
    let (e, proj) = name.strip_prefix("mlp.experts.")?.split_once('.')?;
    let e: usize = e.parse().ok()?;
    if e >= cfg.num_experts || name != format!("mlp.experts.{e}.{proj}") {
        return None;
    }
    match proj {
        "gate_proj.weight" => Some(Part::ExpertGate(e)),
        "up_proj.weight" => Some(Part::ExpertUp(e)),
        "down_proj.weight" => Some(Part::ExpertDown(e)),
        _ => None,
    }
}

fn part_shape(cfg: &ModelConfig, part: Part) -> Option<Vec<usize>> {
    let (h, hd, inter) = (cfg.hidden_size, cfg.head_dim(), cfg.intermediate_size);
    let (ne, mi) = (cfg.num_experts, cfg.moe_intermediate_size);
    let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let bias = cfg.attention_bias;
    Some(match part {
        Part::Q => vec![nh * hd, h],
        Part::K | Part::V => vec![nkv * hd, h],
        Part::QBias if bias => vec![nh * hd],
        Part::KBias | Part::VBias if bias => vec![nkv * hd],
        Part::QBias | Part::KBias | Part::VBias => return None,
        Part::QNorm | Part::KNorm => vec![hd],
        Part::O => vec![h, nh * hd],
        Part::Gate | Part::Up => vec![inter, h],
        Part::Down => vec![h, inter],
        Part::InputNorm | Part::PostNorm => vec![h],
        Part::Router => vec![ne, h],
        Part::ExpertGate(_) | Part::ExpertUp(_) => vec![mi, h],
        Part::ExpertDown(_) => vec![h, mi],
        Part::ExpertsGateUp => vec![ne, 2 * mi, h],
        Part::ExpertsDown => vec![ne, h, mi],
    })
}

/// The slot and full (unsharded) shape of HF tensor `name` in a model of `cfg`; `None` when
/// the model has no such tensor.
fn locate(cfg: &ModelConfig, name: &str) -> Option<(Slot, Vec<usize>)> {
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    match name {
        "model.embed_tokens.weight" => return Some((Slot::Embed, vec![v, h])),
        "lm_head.weight" => return Some((Slot::LmHead, vec![v, h])),
        "model.norm.weight" => return Some((Slot::Norm, vec![h])),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (index, part) = rest.split_once('.')?;
    let i: usize = index.parse().ok()?;
    if i >= cfg.num_hidden_layers || index != i.to_string() {
        return None;
    }
    let dense_mlp = |p: &Part| matches!(p, Part::Gate | Part::Up | Part::Down);
    let p = if cfg.is_sparse_layer(i) {
        match sparse_part(cfg, part) {
            Some(p) => p,
            None => *LAYER_PARTS
                .iter()
                .find(|(n, p)| *n == part && !dense_mlp(p))
                .map(|(_, p)| p)?,
        }
    } else {
        LAYER_PARTS.iter().find(|(n, _)| *n == part)?.1
    };
    Some((Slot::Layer(i, p), part_shape(cfg, p)?))
}

/// The HF tensors a complete update of a model of `cfg` holds, with their full shapes, in
/// load order (`lm_head.weight` only when the model's lm_head is not `tied` to the
/// embeddings).
pub fn weight_table(cfg: &ModelConfig, tied: bool) -> Vec<(String, Vec<usize>)> {
    let mut t = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, cfg.hidden_size],
    )];
    for i in 0..cfg.num_hidden_layers {
        let sparse = cfg.is_sparse_layer(i);
        for (n, p) in LAYER_PARTS {
            if sparse && matches!(p, Part::Gate | Part::Up | Part::Down) {
                continue;
            }
            if let Some(shape) = part_shape(cfg, p) {
                t.push((format!("model.layers.{i}.{n}"), shape));
            }
        }
        if sparse {
            for (n, p) in sparse_parts(cfg) {
                if let Some(shape) = part_shape(cfg, p) {
                    t.push((format!("model.layers.{i}.{n}"), shape));
                }
            }
        }
    }
    t.push(("model.norm.weight".into(), vec![cfg.hidden_size]));
    if !tied {
        t.push((
            "lm_head.weight".into(),
            vec![cfg.vocab_size, cfg.hidden_size],
        ));
    }
    t
}

/// Checks that a model of `cfg` has a tensor `name` of `shape` and that `dtype` is a float
/// type; the error names the tensor and says what the model expects.
pub fn check_tensor(cfg: &ModelConfig, name: &str, shape: &[usize], dtype: DType) -> Result<()> {
    let refuse = |reason: String| Error::WeightUpdate(format!("tensor `{name}`: {reason}"));
    let Some((_, want)) = locate(cfg, name) else {
        return Err(refuse(format!(
            "the model has no tensor of that name (a {} with {} layers; names as transformers' Qwen3ForCausalLM state_dict gives them)",
            cfg.model_type, cfg.num_hidden_layers
        )));
    };
    if shape != want.as_slice() {
        return Err(refuse(format!("shape {shape:?}, the model's is {want:?}")));
    }
    if !matches!(dtype, DType::BF16 | DType::F16 | DType::F32 | DType::F64) {
        return Err(refuse(format!(
            "dtype {dtype:?}, expected a float type (bf16, f16, f32)"
        )));
    }
    Ok(())
}

impl Qwen3 {
    /// Writes HF tensor `name` (its full, unsharded value) into this rank's weights in place:
    /// converted to the compute dtype, sliced to this rank's shard, stacked into the fused
    /// q|k|v and gate|up matrices, with the attention scale folded into `q_norm` — as
    /// [`Qwen3::load`] does. Refused (nothing written) for a name or shape the model lacks.
    pub fn set_weight(&self, cfg: &ModelConfig, name: &str, value: &Tensor) -> Result<()> {
        check_tensor(cfg, name, value.dims(), value.dtype())?;
        let Some((slot, _)) = locate(cfg, name) else {
            unreachable!("check_tensor accepted it")
        };
        let shard = self.shard();
        let dev = self.device().clone();
        let dtype = self.dtype();
        // Same order of conversions as the loader: to the device, then to the dtype.
        let on_dev = || -> Result<Tensor> { Ok(value.to_device(&dev)?.to_dtype(dtype)?) };
        let hd = cfg.head_dim();
        let (nh, nkv) = (
            cfg.num_attention_heads / shard.world,
            cfg.num_key_value_heads / shard.world,
        );
        let inter = cfg.intermediate_size / shard.world;
        let put = |dst: &Tensor, src: Tensor, offset: usize| -> Result<()> {
            Ok(dst.slice_set(&src.contiguous()?, 0, offset)?)
        };
        match slot {
            Slot::Embed => put(&self.embed, on_dev()?, 0),
            // Tied: one matrix under two names (a state_dict lists both); last write wins.
            Slot::LmHead => put(self.lm_head.weight(), on_dev()?, 0),
            Slot::Norm => put(&self.norm.weight, on_dev()?, 0),
            Slot::Layer(i, part) => {
                let l = &self.layers[i];
                let bias = || {
                    l.attn.qkv.bias().ok_or_else(|| {
                        Error::WeightUpdate(format!("tensor `{name}`: the model has no q/k/v bias"))
                    })
                };
                match part {
                    Part::Q => put(l.attn.qkv.weight(), shard.slice(on_dev()?, 0)?, 0),
                    Part::K => put(l.attn.qkv.weight(), shard.slice(on_dev()?, 0)?, nh * hd),
                    Part::V => put(
                        l.attn.qkv.weight(),
                        shard.slice(on_dev()?, 0)?,
                        (nh + nkv) * hd,
                    ),
                    Part::QBias => put(bias()?, shard.slice(on_dev()?, 0)?, 0),
                    Part::KBias => put(bias()?, shard.slice(on_dev()?, 0)?, nh * hd),
                    Part::VBias => put(bias()?, shard.slice(on_dev()?, 0)?, (nh + nkv) * hd),
                    Part::QNorm => {
                        // As the loader: in the compute dtype on the host, times 1/sqrt(head_dim).
                        let scaled = (value.to_device(&Device::Cpu)?.to_dtype(dtype)?
                            * (1.0 / (hd as f64).sqrt()))?;
                        put(&l.attn.q_norm.weight, scaled.to_device(&dev)?, 0)
                    }
                    Part::KNorm => put(&l.attn.k_norm.weight, on_dev()?, 0),
                    Part::O => put(l.attn.o_proj.weight(), shard.slice(on_dev()?, 1)?, 0),
                    Part::Gate | Part::Up | Part::Down => {
                        let Some(mlp) = l.ffn.dense() else {
                            unreachable!("locate gives dense parts of dense layers only")
                        };
                        match part {
                            Part::Gate => put(mlp.gate_up.weight(), shard.slice(on_dev()?, 0)?, 0),
                            Part::Up => {
                                put(mlp.gate_up.weight(), shard.slice(on_dev()?, 0)?, inter)
                            }
                            _ => put(mlp.down.weight(), shard.slice(on_dev()?, 1)?, 0),
                        }
                    }
                    Part::InputNorm => put(&l.input_norm.weight, on_dev()?, 0),
                    Part::PostNorm => put(&l.post_norm.weight, on_dev()?, 0),
                    Part::Router
                    | Part::ExpertGate(_)
                    | Part::ExpertUp(_)
                    | Part::ExpertDown(_)
                    | Part::ExpertsGateUp
                    | Part::ExpertsDown => {
                        let Some(moe) = l.ffn.sparse() else {
                            unreachable!("locate gives expert parts of sparse layers only")
                        };
                        set_expert_weight(moe, part, on_dev()?, shard)
                    }
                }
            }
        }
    }

    /// Writes the tensors of `ck` listed in `table` (what [`check_checkpoint`] returned for
    /// it: the whole checkpoint was checked before this first write) into this rank's
    /// weights, in order. A tied model whose new checkpoint also stores lm_head keeps one
    /// matrix (the embeddings): the table does not list lm_head then.
    pub fn write_checkpoint(
        &self,
        cfg: &ModelConfig,
        ck: &Checkpoint,
        table: &[(String, Vec<usize>)],
    ) -> Result<()> {
        for (name, shape) in table {
            self.set_weight(cfg, name, &ck.get(name, shape)?)?;
        }
        Ok(())
    }
}

/// Writes an MoE tensor (full, on the device, in the compute dtype) into this rank's stacked
/// experts, as [`MoeBlock::load`] slices it: experts this rank does not hold are skipped.
fn set_expert_weight(
    moe: &super::moe::MoeBlock,
    part: Part,
    value: Tensor,
    shard: super::shard::Shard,
) -> Result<()> {
    let (first, local, il) = (moe.first_expert, moe.local_experts(), moe.intermediate);
    let put = |dst: &Tensor, src: Tensor, offset: usize| -> Result<()> {
        Ok(dst.slice_set(&src.contiguous()?, 0, offset)?)
    };
    // Expert `e`'s slot in the stacked tensors, when this rank holds it.
    let slot = |e: usize| (e >= first && e < first + local).then(|| e - first);
    let flat_gu = moe.gate_up.flatten(0, 1)?;
    let flat_down = moe.down.flatten(0, 1)?;
    let h = moe.down.dim(1)?;
    match part {
        Part::Router => put(&moe.router, value, 0),
        Part::ExpertGate(e) | Part::ExpertUp(e) => {
            let Some(s) = slot(e) else { return Ok(()) };
            let up = usize::from(matches!(part, Part::ExpertUp(_)));
            put(&flat_gu, shard.slice_expert(value, 0)?, (2 * s + up) * il)
        }
        Part::ExpertDown(e) => {
            let Some(s) = slot(e) else { return Ok(()) };
            put(&flat_down, shard.slice_expert(value, 1)?, s * h)
        }
        Part::ExpertsGateUp | Part::ExpertsDown => {
            let full = value.dim(1)?
                / if matches!(part, Part::ExpertsGateUp) {
                    2
                } else {
                    1
                };
            for s in 0..local {
                let v = value.get(first + s)?;
                if matches!(part, Part::ExpertsGateUp) {
                    let g = shard.slice_expert(v.narrow(0, 0, full)?, 0)?;
                    let u = shard.slice_expert(v.narrow(0, full, full)?, 0)?;
                    put(&flat_gu, g, 2 * s * il)?;
                    put(&flat_gu, u, (2 * s + 1) * il)?;
                } else {
                    put(&flat_down, shard.slice_expert(v, 1)?, s * h)?;
                }
            }
            Ok(())
        }
        _ => unreachable!("set_expert_weight takes expert parts only"),
    }
}

/// Checks that `ck` holds exactly the tensors of an update of a model of `cfg` (every one of
/// [`weight_table`], nothing the model lacks, each of its shape and a float dtype), reading
/// headers only; returns the table to write in order.
pub fn check_checkpoint(
    cfg: &ModelConfig,
    ck: &Checkpoint,
    tied: bool,
) -> Result<Vec<(String, Vec<usize>)>> {
    {
        for (name, shape, dtype) in ck.tensors() {
            check_tensor(cfg, name, shape, dtype).map_err(|e| match e {
                Error::WeightUpdate(s) => {
                    Error::WeightUpdate(format!("{s} (in {})", ck.file_of(name)))
                }
                e => e,
            })?;
        }
        let table = weight_table(cfg, tied);
        let missing: Vec<&str> = table
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !ck.has(n))
            .collect();
        if !missing.is_empty() {
            return Err(Error::WeightUpdate(format!(
                "the checkpoint lacks {} of the model's tensors, first `{}`; send a complete state_dict",
                missing.len(),
                missing[0]
            )));
        }
        Ok(table)
    }
}
