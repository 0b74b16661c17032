//! What a trainer announces before it broadcasts weights (`update_info`: names, dtype names,
//! shapes), and how vLLM's packed broadcast groups them: tensors are taken in the announced
//! order and concatenated as raw bytes; a chunk closes as soon as its size exceeds the buffer
//! size (so a chunk ends with the tensor that crossed it), and the last chunk takes the rest.
//! Each chunk is one `uint8` broadcast. Unpacked transfers broadcast each tensor alone.
//!
//! Invariant: [`chunks`] gives, for the same announcement and buffer size, exactly the
//! broadcasts the trainer's `packed_nccl_broadcast_producer` makes (sizes and order).

use std::ops::Range;

use candle_core::DType;

use crate::engine::update::HostTensor;
use crate::error::{Error, Result};

/// vLLM's default packed buffer size (1 GiB).
pub const DEFAULT_BUFFER_BYTES: usize = 1 << 30;

/// One tensor a trainer announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announced {
    /// HF name.
    pub name: String,
    /// Element type, as the trainer named it (`bfloat16`).
    pub torch_dtype: String,
    /// The element type the model can take (`None`: one it cannot, e.g. int8: such tensors
    /// are received, so the trainer's broadcast completes, and then refused).
    pub dtype: Option<DType>,
    /// Bytes an element.
    pub elem_bytes: usize,
    /// Shape.
    pub shape: Vec<usize>,
}

impl Announced {
    /// Bytes on the wire.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.elem_bytes
    }
}

/// The element size of a torch dtype name as vLLM's clients send it (`bfloat16`, also
/// `torch.bfloat16`), and the candle dtype when the model can take it.
pub fn parse_dtype(name: &str) -> Result<(usize, Option<DType>)> {
    let name = name.trim_start_matches("torch.");
    Ok(match name {
        "bfloat16" => (2, Some(DType::BF16)),
        "float16" | "half" => (2, Some(DType::F16)),
        "float32" | "float" => (4, Some(DType::F32)),
        "float64" | "double" => (8, Some(DType::F64)),
        "bool" | "uint8" | "int8" | "float8_e4m3fn" | "float8_e5m2" | "float8_e4m3fnuz"
        | "float8_e5m2fnuz" => (1, None),
        "int16" | "uint16" | "short" => (2, None),
        "int32" | "uint32" | "int" => (4, None),
        "int64" | "uint64" | "long" => (8, None),
        other => {
            return Err(Error::WeightUpdate(format!(
                "dtype `{other}` is not a torch dtype this server knows the size of; send bfloat16, float16 or float32"
            )));
        }
    })
}

/// Reads vLLM's `update_info` (`names`, `dtype_names`, `shapes`, all the same length).
pub fn parse_update_info(info: &serde_json::Value) -> Result<Vec<Announced>> {
    let field = |k: &str| -> Result<&Vec<serde_json::Value>> {
        info.get(k)
            .and_then(|v| v.as_array())
            .ok_or_else(|| Error::WeightUpdate(format!("update_info needs `{k}` (a list)")))
    };
    let (names, dtypes, shapes) = (field("names")?, field("dtype_names")?, field("shapes")?);
    if names.len() != dtypes.len() || names.len() != shapes.len() {
        return Err(Error::WeightUpdate(format!(
            "update_info lists {} names, {} dtype_names and {} shapes; they must match",
            names.len(),
            dtypes.len(),
            shapes.len()
        )));
    }
    names
        .iter()
        .zip(dtypes)
        .zip(shapes)
        .enumerate()
        .map(|(i, ((n, d), s))| {
            let name = n
                .as_str()
                .ok_or_else(|| Error::WeightUpdate(format!("names[{i}] is not a string")))?;
            let torch_dtype = d.as_str().unwrap_or_default().to_string();
            let (elem_bytes, dtype) = parse_dtype(&torch_dtype)
                .map_err(|e| Error::WeightUpdate(format!("`{name}`: {e}")))?;
            let shape = s
                .as_array()
                .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect())
                .ok_or_else(|| {
                    Error::WeightUpdate(format!("shapes[{i}] (`{name}`) is not a list of sizes"))
                })?;
            Ok(Announced {
                name: name.to_string(),
                torch_dtype,
                dtype,
                elem_bytes,
                shape,
            })
        })
        .collect()
}

/// One broadcast: which announced tensors it carries and its size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Indices into the announcement.
    pub tensors: Range<usize>,
    /// Bytes of the broadcast.
    pub bytes: usize,
}

/// The broadcasts of `tensors`: packed into chunks of `buffer_bytes` (vLLM's rule, above), or
/// one per tensor when not `packed`.
pub fn chunks(tensors: &[Announced], packed: bool, buffer_bytes: usize) -> Vec<Chunk> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, t) in tensors.iter().enumerate() {
        size += t.bytes();
        if !packed || size > buffer_bytes {
            out.push(Chunk {
                tensors: start..i + 1,
                bytes: size,
            });
            start = i + 1;
            size = 0;
        }
    }
    if start < tensors.len() {
        out.push(Chunk {
            tensors: start..tensors.len(),
            bytes: size,
        });
    }
    out
}

/// Splits one received chunk into its tensors (those in a dtype the model takes: the others
/// were refused when announced and are dropped here).
pub fn unpack(chunk: &[u8], tensors: &[Announced]) -> Result<Vec<HostTensor>> {
    let total: usize = tensors.iter().map(Announced::bytes).sum();
    if chunk.len() != total {
        return Err(Error::WeightUpdate(format!(
            "a broadcast of {} bytes carries tensors of {total}",
            chunk.len()
        )));
    }
    let mut off = 0;
    Ok(tensors
        .iter()
        .filter_map(|t| {
            let n = t.bytes();
            let bytes = &chunk[off..off + n];
            off += n;
            Some(HostTensor {
                name: t.name.clone(),
                dtype: t.dtype?,
                shape: t.shape.clone(),
                bytes: bytes.to_vec(),
            })
        })
        .collect())
}
