//! Building blocks of the Qwen3 model file: the RMSNorm (whose weight the kernels read), weight
//! stacking at load, and RoPE frequencies and tables.

use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;
use super::weights::Checkpoint;
use crate::error::Result;

/// An RMSNorm whose weight the CUDA kernels read directly.
pub(crate) struct Norm {
    pub(crate) weight: Tensor,
    pub(crate) eps: f64,
}

impl Norm {
    pub(crate) fn new(weight: Tensor, eps: f64) -> Self {
        Self { weight, eps }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            &self.weight,
            self.eps as f32,
        )?)
    }
}

/// The kernels available while loading (stacking weights by device copies).
#[cfg(feature = "cuda")]
pub(crate) type Kx<'a> = Option<&'a crate::engine::cuda::CudaKernels>;
/// The kernels available while loading (none without the `cuda` feature).
#[cfg(not(feature = "cuda"))]
pub(crate) type Kx<'a> = Option<&'a std::convert::Infallible>;

/// Stacks weights along dim 0; on CUDA with the kernels by device copies, so that loading
/// compiles no candle kernel (cold start).
pub(crate) fn cat0(parts: &[Tensor], kx: Kx<'_>) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let Some(k) = kx {
        return k.cat_rows(parts);
    }
    let _ = kx;
    Ok(Tensor::cat(parts, 0)?)
}

pub(crate) fn rms(ck: &Checkpoint, name: &str, size: usize, eps: f64) -> Result<Norm> {
    Ok(Norm::new(ck.get(name, &[size])?, eps))
}

/// RoPE inverse frequencies `theta^(-2i/d)`, as HF computes them (f32).
pub(crate) fn inv_freq(cfg: &ModelConfig) -> Vec<f32> {
    let dim = cfg.head_dim();
    (0..dim)
        .step_by(2)
        .map(|i| 1f32 / cfg.rope_theta.powf(i as f64 / dim as f64) as f32)
        .collect()
}

/// cos/sin tables `[max, head_dim / 2]` for positions `0..max`.
pub(crate) fn rope_tables(
    cfg: &ModelConfig,
    max: usize,
    dtype: DType,
    dev: &Device,
) -> Result<(Tensor, Tensor)> {
    let dim = cfg.head_dim();
    let max = max.max(1);
    let inv = inv_freq(cfg);
    // On the host, then one upload each (no device kernel to compile at load).
    let mut cos = Vec::with_capacity(max * dim / 2);
    let mut sin = Vec::with_capacity(max * dim / 2);
    for p in 0..max {
        for f in &inv {
            let (s, c) = (p as f32 * f).sin_cos();
            cos.push(c);
            sin.push(s);
        }
    }
    let table = |v: Vec<f32>| -> Result<Tensor> {
        Ok(Tensor::from_vec(v, (max, dim / 2), &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(dev)?)
    };
    Ok((table(cos)?, table(sin)?))
}
