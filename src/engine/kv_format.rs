//! The KV cache's storage format: its dtype (the compute dtype, or fp8 e4m3) and, for fp8,
//! one f32 scale per layer for K and one for V. A stored value is `x / scale` rounded to e4m3
//! with saturation at ±448; a read value is `stored * scale`. Both the candle-op path
//! ([`quantize`], [`dequantize`]) and the CUDA kernels (which dequantize in registers) follow
//! this one definition.
//!
//! An fp8 cache is stored as `U8` tensors holding the e4m3 bits ([`FP8_STORAGE`]): every
//! candle op that moves blocks (index_select, scatter_set, copies between devices) works on
//! bytes on every device, where candle 0.11's own `F8E4M3` ops on CUDA look up kernels by
//! names candle-kernels does not define (`cast_f32_f8e4m3` for `cast_f32_f8_e4m3`).
//!
//! A bottom room: the model (the cache, the gather path) and the CUDA launchers both use it,
//! and it uses neither.

use candle_core::{DType, Tensor};

use crate::error::Result;

/// The largest finite e4m3 value: a stored K or V saturates there.
pub const FP8_E4M3_MAX: f32 = 448.0;

/// The tensor dtype of an fp8 cache: bytes holding e4m3 bits.
pub const FP8_STORAGE: DType = DType::U8;

/// The value of one e4m3 byte (sign, 4 exponent bits of bias 7, 3 mantissa bits; `0x7f` and
/// `0xff` are NaN, there is no infinity).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((b >> 3) & 0x0f), f32::from(b & 0x07));
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    sign * if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// The scales of one layer's K and V: the real value is the stored one times the scale (1.0
/// for a cache in the compute dtype).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScale {
    /// K's scale.
    pub k: f32,
    /// V's scale.
    pub v: f32,
}

impl KvScale {
    /// No scaling (a cache in the compute dtype).
    pub const ONE: Self = Self { k: 1.0, v: 1.0 };

    /// The scales that map the largest magnitudes seen (`amax`) onto e4m3's largest value
    /// (`amax / 448`); a zero or non-finite magnitude keeps 1.0.
    pub fn from_amax(k_amax: f32, v_amax: f32) -> Self {
        let s = |a: f32| {
            if a.is_finite() && a > 0.0 {
                a / FP8_E4M3_MAX
            } else {
                1.0
            }
        };
        Self {
            k: s(k_amax),
            v: s(v_amax),
        }
    }

    /// Whether both scales are finite and positive (what a checkpoint's must be).
    pub fn is_valid(&self) -> bool {
        [self.k, self.v].iter().all(|s| s.is_finite() && *s > 0.0)
    }
}

/// One layer's K and V cache tensors (head-major `[kv_heads, slots, head_dim]`) with their
/// scales: what the attention of that layer reads and writes.
#[derive(Debug, Clone, Copy)]
pub struct KvRef<'a> {
    /// The K cache.
    pub k: &'a Tensor,
    /// The V cache.
    pub v: &'a Tensor,
    /// Their scales ([`KvScale::ONE`] unless fp8).
    pub scale: KvScale,
    /// fp8 caches: this forward's own K and V before rounding (`[tokens, kv_heads, head_dim]`
    /// in the compute dtype). A prefill attends to its chunk's keys and values from here and
    /// only to the cached prefix's from the cache (a prompt prefilled in one chunk is then
    /// exact; decode reads the cache). The KV write fills them on the kernels.
    pub fresh: Option<(&'a Tensor, &'a Tensor)>,
}

impl<'a> KvRef<'a> {
    /// Caches in the compute dtype (scale 1).
    pub fn plain(k: &'a Tensor, v: &'a Tensor) -> Self {
        Self {
            k,
            v,
            scale: KvScale::ONE,
            fresh: None,
        }
    }

    /// Whether the caches hold fp8 e4m3 (bytes, [`FP8_STORAGE`]).
    pub fn is_fp8(&self) -> bool {
        self.k.dtype() == FP8_STORAGE
    }
}

/// `x / scale`, saturated to ±448 and rounded to e4m3 (nearest, ties to even): the bytes
/// ([`FP8_STORAGE`]) on x's device. The rounding runs on the CPU (the candle-op path's KV
/// write, and the kernels' checks).
pub fn quantize(x: &Tensor, scale: f32) -> Result<Tensor> {
    let m = FP8_E4M3_MAX as f64;
    let e4m3 = x
        .to_device(&candle_core::Device::Cpu)?
        .to_dtype(DType::F32)?
        .affine(1.0 / scale as f64, 0.0)?
        .clamp(-m, m)?
        .to_dtype(DType::F8E4M3)?
        .flatten_all()?;
    let (storage, layout) = e4m3.storage_and_layout();
    let (a, b) = layout
        .contiguous_offsets()
        .ok_or_else(|| crate::error::Error::Engine("a non-contiguous e4m3 tensor".into()))?;
    let candle_core::Storage::Cpu(candle_core::CpuStorage::F8E4M3(v)) = &*storage else {
        return Err(crate::error::Error::Engine(
            "e4m3 rounding left the CPU".into(),
        ));
    };
    let bytes: Vec<u8> = v[a..b].iter().map(|f| f.to_bits()).collect();
    Ok(Tensor::from_vec(bytes, x.shape(), x.device())?)
}

/// Stored values back in `dtype`: `stored * scale` for e4m3 bytes (a table of the 256 values,
/// gathered on x's device), a conversion (or nothing) otherwise.
pub fn dequantize(x: &Tensor, scale: f32, dtype: DType) -> Result<Tensor> {
    if x.dtype() == FP8_STORAGE {
        let table: Vec<f32> = (0..=255u8).map(e4m3_to_f32).collect();
        let table = Tensor::new(table.as_slice(), x.device())?;
        return Ok(table
            .index_select(&x.flatten_all()?, 0)?
            .reshape(x.shape())?
            .affine(scale as f64, 0.0)?
            .to_dtype(dtype)?);
    }
    if x.dtype() == dtype {
        return Ok(x.clone());
    }
    Ok(x.to_dtype(dtype)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn round_trips_within_e4m3_precision_and_saturates_at_448() {
        let x = Tensor::new(
            &[0.0f32, 1.0, -3.3, 100.0, 1000.0, -1e6, 0.01],
            &Device::Cpu,
        )
        .unwrap();
        let q = quantize(&x, 2.0).unwrap();
        assert_eq!(q.dtype(), FP8_STORAGE);
        let back: Vec<f32> = dequantize(&q, 2.0, DType::F32).unwrap().to_vec1().unwrap();
        // 1000 / 2 = 500 and -1e6 / 2 saturate to ±448 (times the scale: ±896).
        assert_eq!(back[4], 896.0);
        assert_eq!(back[5], -896.0);
        for (a, b) in [0.0f32, 1.0, -3.3, 100.0].iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() / 16.0 + 1e-6, "{a} -> {b}");
        }
        // 0.01 / 2 is an e4m3 subnormal: kept to within its step (2^-9 * 2).
        assert!((back[6] - 0.01).abs() <= 2.0 * 2f32.powi(-9));
    }

    #[test]
    fn the_byte_table_is_candles_e4m3() {
        // Every finite e4m3 value rounds to its own byte (a table entry off by a step, or a
        // wrong exponent bias, maps some value to a neighbour's byte).
        let values: Vec<f32> = (0..=255u8).map(e4m3_to_f32).collect();
        let finite: Vec<(u8, f32)> = (0..=255u8)
            .zip(values.iter().copied())
            .filter(|(_, v)| !v.is_nan())
            .collect();
        assert_eq!(finite.len(), 254);
        let x = Tensor::new(finite.iter().map(|f| f.1).collect::<Vec<_>>(), &Device::Cpu).unwrap();
        let bytes: Vec<u8> = quantize(&x, 1.0).unwrap().to_vec1().unwrap();
        for ((b, v), got) in finite.iter().zip(&bytes) {
            // Zero's two signs both read back as zero; -0.0 rounds to 0x80.
            assert!(b == got || *v == 0.0, "{v} -> {got:#x}, not {b:#x}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    #[test]
    fn scales_come_from_the_largest_magnitude() {
        let s = KvScale::from_amax(896.0, 0.0);
        assert_eq!(s.k, 2.0);
        assert_eq!(s.v, 1.0);
        assert!(s.is_valid());
        assert!(!KvScale { k: 0.0, v: 1.0 }.is_valid());
        assert!(
            !KvScale {
                k: f32::NAN,
                v: 1.0
            }
            .is_valid()
        );
    }
}
