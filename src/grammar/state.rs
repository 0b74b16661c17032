//! One constrained output's place in its grammar: the mask of the tokens it may take next,
//! and the tokens it took.
//!
//! Invariant: the matcher has consumed exactly the output's tokens so far (the scheduler
//! feeds it each token it appends to a constrained sequence, EOS included).

use llguidance::Matcher;

use crate::error::{Error, Result};

/// A place in a [`Grammar`](super::Grammar): which tokens may come next, and the tokens taken
/// so far. The engine keeps one per constrained sequence; hosts may walk one to check a token
/// sequence against a grammar ([`Grammar::matcher`](super::Grammar::matcher)).
pub struct GrammarMatcher {
    matcher: Matcher,
    vocab_size: usize,
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl GrammarMatcher {
    pub(super) fn new(matcher: Matcher, vocab_size: usize) -> Self {
        Self {
            matcher,
            vocab_size,
        }
    }

    /// The tokens allowed next, one bit per token id (bit `t % 32` of word `t / 32`; as many
    /// words as the vocabulary needs): only the end-of-sequence token once the grammar is
    /// complete and admits nothing more.
    pub fn mask(&mut self) -> Result<Vec<u32>> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| Error::Grammar(format!("the grammar failed: {e}")))?;
        let mut out = mask.as_slice().to_vec();
        out.resize(self.vocab_size.div_ceil(32), 0);
        if out.iter().all(|&w| w == 0) {
            return Err(Error::Grammar("the grammar allows no token here".into()));
        }
        Ok(out)
    }

    /// Whether `token` may come next.
    pub fn allows(&mut self, token: u32) -> Result<bool> {
        let mask = self.mask()?;
        Ok(mask
            .get(token as usize / 32)
            .is_some_and(|w| (w >> (token % 32)) & 1 == 1))
    }

    /// Takes `token` (an error, leaving the matcher unusable, when the grammar does not allow
    /// it).
    pub fn consume(&mut self, token: u32) -> Result<()> {
        self.matcher
            .consume_token(token)
            .map_err(|e| Error::Grammar(format!("the grammar refused token {token}: {e}")))
    }

    /// Whether the output so far is a complete sentence of the grammar (the end-of-sequence
    /// token may come next).
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
