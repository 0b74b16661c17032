//! Masks split across threads: the vocabulary cut into parts by the first two bytes of each token,
//! one llguidance bias computer per part (a token trie holding only that part's tokens), so
//! that one expensive mask (inside a JSON string with `maxLength` llguidance walks most of the
//! trie: ~1 ms) is computed by several threads at once, each walking its own subtrees.
//!
//! Invariants: the parts are disjoint and cover every token with bytes, so the union of the
//! parts' masks is the whole vocabulary's mask; a part's mask always carries the `sentinel`
//! token (an id without bytes, which no grammar ever allows), because llguidance stops a
//! parser whose mask is empty, and the union drops it again.

use std::sync::Arc;

use llguidance::earley::{BiasComputer, ParserRecognizer, SlicedBiasComputer};
use llguidance::toktrie::{SimpleVob, TokEnv, TokTrie};
use tokenizers::Tokenizer;

use super::bounded::Bounded;
use super::vocab::TokenEnv;
use crate::error::{Error, Result};

/// The bias computers of the vocabulary's parts, and the token their masks carry.
pub(crate) struct MaskParts {
    pub(crate) computers: Vec<Arc<dyn BiasComputer>>,
    pub(crate) sentinel: u32,
}

impl std::fmt::Debug for MaskParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaskParts")
            .field("parts", &self.computers.len())
            .finish()
    }
}

impl MaskParts {
    /// `parts` bias computers over `words` (one entry per logits column), each with the slices
    /// `slices`, under the bounded-string shortcut when `bounded` is the index of the slice of
    /// unbounded string content among them; `None` when there is nothing to split (fewer than
    /// two parts, or no id without bytes to carry as the sentinel).
    pub(crate) fn new(
        words: &[Vec<u8>],
        tokenizer: &Arc<Tokenizer>,
        eos: u32,
        slices: &[String],
        parts: usize,
        bounded: Option<usize>,
    ) -> Result<Option<Self>> {
        let Some(sentinel) = words.iter().position(|w| w.is_empty()) else {
            return Ok(None);
        };
        if parts < 2 {
            return Ok(None);
        }
        let part_of = part_of_prefix(words, parts);
        let built: Vec<Result<Arc<dyn BiasComputer>>> = {
            use rayon::prelude::*;
            (0..parts)
                .into_par_iter()
                .map(|p| {
                    let mine: Vec<Vec<u8>> = words
                        .iter()
                        .map(|w| match part_of.get(&prefix(w)) {
                            Some(&q) if q == p && !w.is_empty() => w.clone(),
                            _ => Vec::new(),
                        })
                        .collect();
                    let env: TokEnv =
                        Arc::new(TokenEnv::from_words(&mine, tokenizer.clone(), eos)?);
                    let sliced: Arc<dyn BiasComputer> = Arc::new(
                        SlicedBiasComputer::new(&env, slices)
                            .map_err(|e| Error::Grammar(e.to_string()))?,
                    );
                    let inner = match bounded {
                        Some(unbounded) => Arc::new(Bounded::new(sliced, unbounded)),
                        None => sliced,
                    };
                    Ok(Arc::new(Part {
                        inner,
                        sentinel: sentinel as u32,
                    }) as Arc<dyn BiasComputer>)
                })
                .collect()
        };
        Ok(Some(Self {
            computers: built.into_iter().collect::<Result<_>>()?,
            sentinel: sentinel as u32,
        }))
    }

    /// The union of the parts' masks, without the sentinel.
    pub(crate) fn union(&self, masks: &[SimpleVob]) -> SimpleVob {
        let mut all = masks[0].clone();
        for m in &masks[1..] {
            all.or(m);
        }
        all.disallow_token(self.sentinel);
        all
    }
}

/// The first two bytes of a token (fewer for shorter ones): the subtree of the token trie it
/// lies in. A third of Qwen3's tokens start with a space, so one byte would not split them.
fn prefix(w: &[u8]) -> (Option<u8>, Option<u8>) {
    (w.first().copied(), w.get(1).copied())
}

/// The part of each two-byte prefix: the prefixes in order of their token counts, each to the
/// part with the fewest tokens so far.
fn part_of_prefix(
    words: &[Vec<u8>],
    parts: usize,
) -> std::collections::HashMap<(Option<u8>, Option<u8>), usize> {
    let mut count: std::collections::HashMap<(Option<u8>, Option<u8>), usize> =
        std::collections::HashMap::new();
    for w in words.iter().filter(|w| !w.is_empty()) {
        *count.entry(prefix(w)).or_default() += 1;
    }
    let mut order: Vec<_> = count.iter().map(|(&k, &n)| (n, k)).collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    let mut load = vec![0usize; parts];
    let mut part_of = std::collections::HashMap::with_capacity(order.len());
    for (n, key) in order {
        let p = (0..parts).min_by_key(|&p| load[p]).unwrap_or(0);
        part_of.insert(key, p);
        load[p] += n;
    }
    part_of
}

/// One part's bias computer: llguidance's sliced computer over the part's trie (under the
/// bounded-string shortcut unless turned off), its masks carrying the sentinel.
struct Part {
    inner: Arc<dyn BiasComputer>,
    sentinel: u32,
}

impl BiasComputer for Part {
    fn compute_bias(&self, rec: &mut ParserRecognizer<'_>, start: &[u8]) -> SimpleVob {
        let mut set = self.inner.compute_bias(rec, start);
        set.allow_token(self.sentinel);
        set
    }

    fn trie(&self) -> &TokTrie {
        self.inner.trie()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_spread_evenly_and_every_token_has_a_part() {
        let mut words = vec![vec![b' ']];
        for b in 0..=255u8 {
            for k in 0..(b as usize % 7 + 1) {
                words.push(vec![b' ', b, k as u8]);
                words.push(vec![b]);
            }
        }
        let part_of = part_of_prefix(&words, 4);
        let mut load = [0usize; 4];
        for w in &words {
            load[part_of[&prefix(w)]] += 1;
        }
        // Most tokens start with a space, and are spread by their second byte.
        let (lo, hi) = (load.iter().min().unwrap(), load.iter().max().unwrap());
        assert!(hi - lo <= 7, "{load:?}");
        assert!(part_of.values().all(|&p| p < 4));
    }
}
