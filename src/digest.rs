//! The crate's one stable hash: weights digests (`engine::update`) and the disk KV tier's
//! block keys and checksums (`cache`) use it. Its output depends only on the bytes given,
//! never on the machine or the Rust version, so keys written by one process are found by the
//! next.

/// A word-at-a-time multiplicative hash (not cryptographic: it tells versions apart, it does
/// not authenticate them).
pub(crate) struct Hasher {
    lanes: [u64; 4],
    len: u64,
}

impl Default for Hasher {
    fn default() -> Self {
        Self {
            lanes: [
                0x243f_6a88_85a3_08d3,
                0x1319_8a2e_0370_7344,
                0xa409_3822_299f_31d0,
                0x082e_fa98_ec4e_6c89,
            ],
            len: 0,
        }
    }
}

const K: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(h: u64, w: u64) -> u64 {
    let x = (h ^ w).wrapping_mul(K);
    x ^ (x >> 29)
}

impl Hasher {
    /// Mixes one word in.
    pub(crate) fn word(&mut self, w: u64) {
        self.lanes[0] = mix(self.lanes[0], w);
        self.len += 8;
    }

    /// Mixes bytes in (their length too).
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        let mut blocks = b.chunks_exact(32);
        for blk in &mut blocks {
            for (i, lane) in self.lanes.iter_mut().enumerate() {
                let w = u64::from_le_bytes(blk[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
                *lane = mix(*lane, w);
            }
        }
        let rest = blocks.remainder();
        let mut words = rest.chunks(8);
        for w in &mut words {
            let mut buf = [0u8; 8];
            buf[..w.len()].copy_from_slice(w);
            self.lanes[0] = mix(self.lanes[0], u64::from_le_bytes(buf));
        }
        self.len += b.len() as u64;
        self.lanes[1] = mix(self.lanes[1], b.len() as u64);
    }

    /// The digest of everything mixed in so far.
    pub(crate) fn finish(&self) -> u64 {
        let mut h = self.len;
        for l in self.lanes {
            h = mix(h, l);
        }
        h
    }
}
