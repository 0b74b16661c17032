//! The NCCL unique id a trainer publishes in its rendezvous store: vLLM's
//! `StatelessProcessGroup.broadcast_obj` stores `pickle.dumps(ncclUniqueId)` (a ctypes
//! structure of 128 bytes). This reads the pickle's opcodes (protocols 3 to 5), without
//! running any of it, and returns the structure's bytes.
//!
//! Invariant: only a pickle that references a class named `ncclUniqueId` and holds exactly
//! one 128-byte bytes object is accepted; anything else is an error saying what was found.

use crate::error::{Error, Result};

/// Bytes of an NCCL unique id.
pub const NCCL_ID_BYTES: usize = 128;

fn bad(reason: impl std::fmt::Display) -> Error {
    Error::WeightUpdate(format!(
        "the NCCL id in the trainer's store is not a pickled ncclUniqueId: {reason}"
    ))
}

/// The 128 bytes of the `ncclUniqueId` pickled in `data`.
pub fn nccl_id_from_pickle(data: &[u8]) -> Result<[u8; NCCL_ID_BYTES]> {
    let mut pos = 0usize;
    let take = |pos: &mut usize, n: usize| -> Result<&[u8]> {
        let end = pos
            .checked_add(n)
            .filter(|e| *e <= data.len())
            .ok_or_else(|| bad(format!("truncated at byte {}", *pos)))?;
        let s = &data[*pos..end];
        *pos = end;
        Ok(s)
    };
    let len = |b: &[u8]| -> usize {
        let mut v = [0u8; 8];
        v[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(v) as usize
    };
    let mut strings: Vec<String> = Vec::new();
    let mut bytes: Vec<&[u8]> = Vec::new();
    loop {
        let op = *take(&mut pos, 1)?.first().expect("one byte");
        match op {
            0x80 => {
                let proto = take(&mut pos, 1)?[0];
                if proto < 3 {
                    return Err(bad(format!(
                        "pickle protocol {proto}; protocols 3 to 5 are read"
                    )));
                }
            }
            0x95 => {
                take(&mut pos, 8)?;
            }
            0x8c | b'X' | 0x8d => {
                let n = match op {
                    0x8c => 1,
                    b'X' => 4,
                    _ => 8,
                };
                let l = len(take(&mut pos, n)?);
                let s = take(&mut pos, l)?;
                strings.push(String::from_utf8_lossy(s).into_owned());
            }
            b'C' | b'B' | 0x8e => {
                let n = match op {
                    b'C' => 1,
                    b'B' => 4,
                    _ => 8,
                };
                let l = len(take(&mut pos, n)?);
                bytes.push(take(&mut pos, l)?);
            }
            b'c' => {
                for _ in 0..2 {
                    let rest = &data[pos..];
                    let nl = rest
                        .iter()
                        .position(|&b| b == b'\n')
                        .ok_or_else(|| bad("unterminated GLOBAL"))?;
                    strings.push(String::from_utf8_lossy(&rest[..nl]).into_owned());
                    pos += nl + 1;
                }
            }
            b'q' | b'h' | b'K' => {
                take(&mut pos, 1)?;
            }
            b'M' => {
                take(&mut pos, 2)?;
            }
            b'r' | b'j' | b'J' => {
                take(&mut pos, 4)?;
            }
            0x94 | 0x93 | b'}' | b')' | b'(' | b't' | 0x85 | 0x86 | 0x87 | b'R' | b'b' | b'N'
            | 0x88 | 0x89 | b's' | b'u' => {}
            b'.' => break,
            other => return Err(bad(format!("unexpected pickle opcode 0x{other:02x}"))),
        }
    }
    if !strings.iter().any(|s| s == "ncclUniqueId") {
        return Err(bad(format!(
            "it references {:?}, not ncclUniqueId",
            strings
        )));
    }
    let ids: Vec<&&[u8]> = bytes.iter().filter(|b| b.len() == NCCL_ID_BYTES).collect();
    match ids.as_slice() {
        [one] => {
            let mut id = [0u8; NCCL_ID_BYTES];
            id.copy_from_slice(one);
            Ok(id)
        }
        _ => Err(bad(format!(
            "{} bytes objects of {NCCL_ID_BYTES} bytes in it (one expected)",
            ids.len()
        ))),
    }
}
