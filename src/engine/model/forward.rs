//! [`Model`]: one rank's loaded model as a runner runs it: the [`Qwen3`] weights and, on CUDA,
//! the kernels that run its forward (`KernelForward`, in `kernel_forward.rs`) — or none, and the candle-op path runs
//! it (the CPU, and the reference the kernels are checked against).
//!
//! Invariant: both paths take the same inputs and give the same outputs (logits rows in
//! batch order, f32), so the runner and the worker never ask which one runs.

use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;
#[cfg(feature = "cuda")]
use super::kernel_forward::KernelForward;
use super::kv_cache::PagedKvCache;
use super::qwen3::{Ffn, Qwen3};
use super::shard::Shard;
use crate::engine::batch::SeqInput;
#[cfg(feature = "cuda")]
use crate::engine::cuda::{CudaKernels, LaunchOptions};
use crate::engine::options::KernelOptions;
use crate::engine::parallel::comm::CommBackend;
use crate::error::{Error, Result};
use candle_nn::Linear;

/// One rank's model: weights plus the kernels that run them (when there are any).
pub struct Model {
    /// The weights (and the candle-op forward).
    pub qwen3: Qwen3,
    /// The engine's own CUDA kernels (None: the candle path).
    #[cfg(feature = "cuda")]
    pub kernels: Option<CudaKernels>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("dtype", &self.dtype())
            .field("kernels", &self.uses_kernels())
            .finish()
    }
}

/// The kernels for a model, or `None` where the candle path serves it: not on CUDA, kernels
/// turned off in `opts`, a dtype other than bf16/f32, a head_dim other than 128, or q/k/v
/// biases.
#[cfg(feature = "cuda")]
pub fn kernels_for(
    cfg: &ModelConfig,
    device: &Device,
    dtype: DType,
    opts: &KernelOptions,
) -> Result<Option<CudaKernels>> {
    if !opts.kernels {
        tracing::info!("kernels turned off (KernelOptions::kernels): the forward runs candle ops");
        return Ok(None);
    }
    if cfg.head_dim() != 128 || cfg.attention_bias {
        return Ok(None);
    }
    CudaKernels::new(device, dtype, &launch_options(opts, cfg))
}

/// The launch paths `opts` asks for on a model of `cfg`, as the kernels take them (also what
/// `examples/graph_check`'s op profile launches with).
#[cfg(feature = "cuda")]
pub fn launch_options(opts: &KernelOptions, cfg: &ModelConfig) -> LaunchOptions {
    LaunchOptions::from_kernel_options(opts, cfg.is_moe())
}

/// The kernels for a model: none without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub fn kernels_for(
    _cfg: &ModelConfig,
    _device: &Device,
    _dtype: DType,
    _opts: &KernelOptions,
) -> Result<Option<std::convert::Infallible>> {
    Ok(None)
}

impl Model {
    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        self.qwen3.device()
    }

    /// The compute dtype.
    pub fn dtype(&self) -> DType {
        self.qwen3.dtype()
    }

    /// The KV heads this rank holds.
    pub fn local_kv_heads(&self) -> usize {
        self.qwen3.local_kv_heads()
    }

    /// This rank's shard.
    pub fn shard(&self) -> Shard {
        self.qwen3.shard()
    }

    /// Whether the forward runs the engine's own CUDA kernels.
    pub fn uses_kernels(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.kernels.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// Reserves LoRA adapter slots on this model (an engine does it at load from
    /// `EngineOptions::lora`); a forward's rows on a slot (`SeqInput::adapter`) add its delta.
    pub fn set_lora_slots(&mut self, slots: super::lora_slots::LoraSlots) {
        self.qwen3.lora = Some(slots);
    }

    /// Stores the LoRA slots' `a` after each layer's fused weights, one buffer per matmul, so
    /// that steps of up to 64 rows compute the shrinks as extra columns of the base matmuls
    /// (`KernelOptions::lora_wide`; the same values, so the candle path gives what it gave).
    /// Refused without slots, on tensor-parallel shards and on MoE models.
    pub fn widen_lora_slots(&mut self) -> Result<()> {
        let world = self.shard().world;
        let Qwen3 { lora, layers, .. } = &mut self.qwen3;
        let Some(slots) = lora.as_mut() else {
            return Err(Error::Engine(
                "the wide LoRA layout needs adapter slots".into(),
            ));
        };
        if world > 1 || layers.iter().any(|l| l.ffn.dense().is_none()) {
            return Err(Error::Unsupported(
                "the wide LoRA layout (KernelOptions::lora_wide) serves dense models on one GPU"
                    .into(),
            ));
        }
        for (layer, groups) in layers.iter_mut().zip(slots.layers.iter_mut()) {
            let attn = &mut layer.attn;
            let Ffn::Dense(mlp) = &mut layer.ffn else {
                unreachable!("checked above: every layer is dense")
            };
            let lins = [
                &mut attn.qkv,
                &mut attn.o_proj,
                &mut mlp.gate_up,
                &mut mlp.down,
            ];
            for (lin, sg) in lins.into_iter().zip(groups.iter_mut()) {
                if sg.wide.is_some() {
                    continue;
                }
                let (n, k) = lin.weight().dims2()?;
                let (s, pr, _) = sg.a.dims3()?;
                let full = Tensor::cat(&[lin.weight(), &sg.a.reshape((s * pr, k))?], 0)?;
                *lin = Linear::new(full.narrow(0, 0, n)?, lin.bias().cloned());
                sg.a = full.narrow(0, n, s * pr)?.reshape((s, pr, k))?;
                sg.wide = Some(full);
            }
        }
        Ok(())
    }

    /// The LoRA slots, when reserved (write an adapter into one with `LoraSlots::load`).
    pub fn lora_slots(&self) -> Option<&super::lora_slots::LoraSlots> {
        self.qwen3.lora.as_ref()
    }

    /// Whether this model's forward serves an fp8 KV cache (`Err`: why not): the candle path
    /// on the CPU does; on CUDA the engine's kernels must (bf16 compute on an fp8 GPU).
    pub fn fp8_kv(&self) -> std::result::Result<(), String> {
        #[cfg(feature = "cuda")]
        if let Some(k) = &self.kernels {
            return k.fp8_kv();
        }
        if self.device().is_cpu() {
            Ok(())
        } else {
            Err("fp8 KV on a GPU needs the engine's kernels (drop --no-kernels)".into())
        }
    }

    /// Runs the candle-op path from now on (the reference the kernels are tested against).
    pub fn disable_kernels(&mut self) {
        #[cfg(feature = "cuda")]
        {
            self.kernels = None;
        }
    }

    /// The kernel forward, when the kernels run this model.
    #[cfg(feature = "cuda")]
    pub fn kernel_forward(&self) -> Option<KernelForward<'_>> {
        self.kernels.as_ref().map(|kernels| KernelForward {
            model: &self.qwen3,
            kernels,
        })
    }

    /// Runs one varlen batch (see [`Qwen3::forward`]) on the kernels when they serve this
    /// model, else on candle ops.
    pub fn forward(
        &self,
        tokens: &[u32],
        seqs: &[SeqInput<'_>],
        cache: &PagedKvCache,
        comm: Option<&dyn CommBackend>,
    ) -> Result<Option<Tensor>> {
        #[cfg(feature = "cuda")]
        if let Some(kf) = self.kernel_forward() {
            return kf.forward(tokens, seqs, cache, comm);
        }
        self.qwen3.forward(tokens, seqs, cache, comm)
    }
}
