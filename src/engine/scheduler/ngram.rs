//! The n-gram index of one sequence's tokens (speculative decoding's drafts, `speculate.rs`):
//! plain data, updated as tokens are appended.
//!
//! Invariant: indexing costs O(new tokens x lengths) per call, never the transcript's length;
//! a suffix never matches itself (only n-grams ending before the last token are indexed).

use std::collections::HashMap;

/// The n-grams of one sequence's tokens: for each length, where it last ended.
#[derive(Debug, Clone)]
pub(crate) struct NgramIndex {
    min: usize,
    max: usize,
    /// Per length (`min..=max`): hash of the n-gram -> the position of its last token.
    ends: Vec<HashMap<u64, u32>>,
    /// N-grams ending before this position are indexed.
    indexed: usize,
    /// N-grams inserted so far (the index's whole work: each position once per length).
    pub(crate) inserted: u64,
}

fn hash(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ t as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl NgramIndex {
    pub(crate) fn new(min: usize, max: usize) -> Self {
        Self {
            min,
            max,
            ends: (min..=max).map(|_| HashMap::new()).collect(),
            indexed: 0,
            inserted: 0,
        }
    }

    /// Indexes the n-grams of `tokens` that end before its last token (the suffix being
    /// matched must find an earlier occurrence, not itself).
    fn extend(&mut self, tokens: &[u32]) {
        let upto = tokens.len().saturating_sub(1);
        for end in self.indexed..upto {
            for (k, n) in (self.min..=self.max).enumerate() {
                if end + 1 >= n {
                    self.ends[k].insert(hash(&tokens[end + 1 - n..=end]), end as u32);
                    self.inserted += 1;
                }
            }
        }
        self.indexed = self.indexed.max(upto);
    }

    /// Up to `k` tokens that followed the latest earlier occurrence of the longest matching
    /// suffix of `tokens` (longest n first); empty when no suffix occurred before.
    pub(crate) fn propose(&mut self, tokens: &[u32], k: usize) -> Vec<u32> {
        self.extend(tokens);
        let len = tokens.len();
        for (idx, n) in (self.min..self.max + 1).enumerate().rev() {
            if len < n || k == 0 {
                continue;
            }
            let suffix = &tokens[len - n..];
            if let Some(&end) = self.ends[idx].get(&hash(suffix)) {
                let end = end as usize;
                // A hash collision is no match.
                if tokens[end + 1 - n..=end] == *suffix {
                    return tokens[end + 1..(end + 1 + k).min(len)].to_vec();
                }
            }
        }
        Vec::new()
    }
}
