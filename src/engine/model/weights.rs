//! Checkpoint reading: safetensors (single file or shards), mmapped, checked tensor by tensor
//! before use so that a broken checkpoint names the tensor and file instead of panicking.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, safetensors::MmapedSafetensors};

use crate::error::{Error, Result};

/// The tensors of a checkpoint, by HF name, mmapped.
pub struct Checkpoint {
    st: MmapedSafetensors,
    index: HashMap<String, (PathBuf, Vec<usize>, safetensors::Dtype)>,
    dtype: DType,
    device: Device,
}

impl Checkpoint {
    /// Mmaps the files of model `key` and reads their headers. Tensors are converted to
    /// `dtype` on `device`.
    pub fn open(key: &str, files: &[PathBuf], dtype: DType, device: &Device) -> Result<Self> {
        let mut index = HashMap::new();
        for f in files {
            let data = std::fs::File::open(f).map_err(|e| Error::file(f, e))?;
            // SAFETY: the file is only read; we hold no other mapping that writes to it.
            let mmap = unsafe { memmap2_like(&data, f)? };
            let (_, meta) = safetensors::SafeTensors::read_metadata(&mmap)
                .map_err(|e| Error::file(f, format!("not a valid safetensors file: {e}")))?;
            for (name, info) in meta.tensors() {
                index.insert(
                    name.to_string(),
                    (f.clone(), info.shape.clone(), info.dtype),
                );
            }
        }
        // SAFETY: as above; candle keeps the maps alive as long as `st`.
        let st = unsafe { MmapedSafetensors::multi(files) }.map_err(|e| Error::Load {
            key: key.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            st,
            index,
            dtype,
            device: device.clone(),
        })
    }

    /// The highest decoder-layer index of the checkpoint's tensors (`model.layers.N.*`);
    /// `None` when it holds no layer.
    pub fn max_layer_index(&self) -> Option<usize> {
        self.index
            .keys()
            .filter_map(|n| {
                n.strip_prefix("model.layers.")?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .max()
    }

    /// Decoder layers the checkpoint holds (highest index + 1; saturating, so an absurd index
    /// never wraps to a small count).
    pub fn layer_count(&self) -> usize {
        self.max_layer_index().map_or(0, |n| n.saturating_add(1))
    }

    /// Whether a tensor exists.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Every tensor of the checkpoint: name, shape and dtype (a dtype candle lacks reads as
    /// `U8`, which no float check accepts).
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &[usize], DType)> {
        self.index.iter().map(|(n, (_, shape, d))| {
            let dtype = DType::try_from(*d).unwrap_or(DType::U8);
            (n.as_str(), shape.as_slice(), dtype)
        })
    }

    /// The file holding `name` (every file of the checkpoint when none does).
    pub(crate) fn file_of(&self, name: &str) -> String {
        self.index
            .get(name)
            .map(|(f, _, _)| f.display().to_string())
            .unwrap_or_else(|| {
                let files: Vec<String> = {
                    let mut v: Vec<String> = self
                        .index
                        .values()
                        .map(|(f, _, _)| f.display().to_string())
                        .collect();
                    v.sort();
                    v.dedup();
                    v
                };
                files.join(", ")
            })
    }

    /// The device tensors are loaded onto.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Loads one tensor, checking it exists with this shape and a float dtype.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.get_on(name, shape, &self.device)
    }

    /// [`Checkpoint::get`] onto another device (e.g. the CPU, to adjust a small tensor first).
    pub fn get_on(&self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        let bad = |reason: String| Error::Checkpoint {
            tensor: name.to_string(),
            file: self.file_of(name),
            reason,
        };
        let Some((_, got_shape, got_dtype)) = self.index.get(name) else {
            return Err(bad("missing (the checkpoint does not hold it)".into()));
        };
        if got_shape.as_slice() != shape {
            return Err(bad(format!(
                "shape {got_shape:?}, expected {shape:?} from config.json"
            )));
        }
        use safetensors::Dtype as S;
        if !matches!(got_dtype, S::F32 | S::F16 | S::BF16 | S::F64) {
            return Err(bad(format!(
                "dtype {got_dtype:?}, expected a float type (bf16, f16, f32)"
            )));
        }
        let t = self.st.load(name, device).map_err(|e| bad(e.to_string()))?;
        t.to_dtype(self.dtype).map_err(|e| bad(e.to_string()))
    }

    /// [`content_digest`](crate::engine::update::content_digest) of every tensor as stored
    /// (sorted by name), read from the mapped files.
    pub fn digest(&self) -> Result<String> {
        let mut names: Vec<&String> = self.index.keys().collect();
        names.sort();
        let views = names
            .iter()
            .map(|n| {
                self.st.get(n).map_err(|e| Error::Checkpoint {
                    tensor: n.to_string(),
                    file: self.file_of(n),
                    reason: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let parts: Vec<(&str, DType, &[usize], &[u8])> = names
            .iter()
            .zip(&views)
            .map(|(n, v)| {
                let dtype = DType::try_from(v.dtype()).unwrap_or(DType::U8);
                (n.as_str(), dtype, v.shape(), v.data())
            })
            .collect();
        Ok(crate::engine::update::content_digest(&parts))
    }

    /// The dtype most tensors are stored in (for dtype "auto").
    pub fn stored_dtype(&self) -> Option<DType> {
        let mut counts: HashMap<&'static str, usize> = HashMap::new();
        for (_, _, d) in self.index.values() {
            let k = match d {
                safetensors::Dtype::BF16 => "bf16",
                safetensors::Dtype::F16 => "f16",
                safetensors::Dtype::F32 => "f32",
                _ => continue,
            };
            *counts.entry(k).or_default() += 1;
        }
        counts
            .into_iter()
            .max_by_key(|(_, c)| *c)
            .map(|(k, _)| match k {
                "bf16" => DType::BF16,
                "f16" => DType::F16,
                _ => DType::F32,
            })
    }
}

/// Maps `file` (at `path`, for the error) into memory read-only.
///
/// # Safety
/// The caller must ensure the file is not modified or truncated while the map lives (a
/// checkpoint being rewritten under a running engine would change or fault its weights);
/// the same contract as `memmap2::Mmap::map`.
unsafe fn memmap2_like(file: &std::fs::File, path: &Path) -> Result<memmap2::Mmap> {
    // SAFETY: forwarded from the caller.
    unsafe { memmap2::Mmap::map(file) }.map_err(|e| Error::file(path, format!("cannot mmap: {e}")))
}
