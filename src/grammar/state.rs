//! One constrained output's place in its grammar: the mask of the tokens it may take next,
//! and the tokens it took.
//!
//! Invariant: the matcher has consumed exactly the output's tokens so far (the scheduler
//! feeds it each token it appends to a constrained sequence, except an end-of-sequence token).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use llguidance::toktrie::SimpleVob;
use llguidance::{Matcher, TokenParser};
use parking_lot::Mutex;

use super::split::MaskParts;
use crate::error::{Error, Result};

/// A mask that allowed more tokens than this makes the next mask of the same matcher a split
/// one (wide masks come in runs, inside a string, and cost ~1 ms; a mask of a few tokens costs
/// 10-100 us whole and more split).
const SPLIT_ABOVE_ALLOWED: usize = 100;

/// A compiled grammar's parser at its start, and the matchers of finished outputs, rewound to
/// the start: a new output takes one of those (whose lexer has already built the states a
/// walk through this grammar needs; a fresh copy of the parser builds them again, which
/// doubles the cost of its first masks).
pub(super) struct Compiled {
    template: TokenParser,
    pool: Mutex<Vec<(Matcher, Vec<Matcher>)>>,
    /// A copy of the first matcher given back, rewound: new matchers are copied from it when
    /// the pool is empty (its lexer has built the states of a walk; a copy of the template
    /// builds them again, which doubles the cost of a new matcher's masks). Copied once: a
    /// walked matcher and its parts are ~1 MB of lexer states, and copying them at every
    /// give-back cost the H200 host ~2 ms per finished request on the scheduler's thread.
    warm: Mutex<Option<(Matcher, Vec<Matcher>)>>,
    /// Rewound matchers kept by all the grammars of one compiler.
    pooled: Arc<AtomicUsize>,
}

/// Most rewound matchers a grammar keeps.
const POOLED: usize = 64;
/// Most rewound matchers the grammars of one compiler keep together (a walked matcher holds
/// ~0.15 MB of lexer states, its parts as much again each; a server cycling through many tool
/// sets keeps at most this many).
pub(super) const POOLED_PER_COMPILER: usize = 256;

impl Compiled {
    pub(super) fn new(template: TokenParser, pooled: Arc<AtomicUsize>) -> Self {
        Self {
            template,
            pool: Mutex::new(Vec::new()),
            warm: Mutex::new(None),
            pooled,
        }
    }

    /// A rewound matcher, if the grammar keeps one, else a copy of the first one given back,
    /// if any.
    fn take(&self) -> Option<(Matcher, Vec<Matcher>)> {
        if let Some(m) = self.pool.lock().pop() {
            self.pooled.fetch_sub(1, Ordering::Relaxed);
            return Some(m);
        }
        let warm = self.warm.lock();
        let (whole, split) = warm.as_ref()?;
        Some((
            whole.deep_clone(),
            split.iter().map(Matcher::deep_clone).collect(),
        ))
    }

    /// Keeps `m` (rewound) for the next output, unless this grammar or the compiler's
    /// grammars keep enough; the first one given back is also copied to copy new matchers
    /// from.
    fn give_back(&self, m: (Matcher, Vec<Matcher>)) {
        {
            let mut warm = self.warm.lock();
            if warm.is_none() {
                *warm = Some((
                    m.0.deep_clone(),
                    m.1.iter().map(Matcher::deep_clone).collect(),
                ));
            }
        }
        let mut pool = self.pool.lock();
        if pool.len() < POOLED
            && self
                .pooled
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < POOLED_PER_COMPILER).then_some(n + 1)
                })
                .is_ok()
        {
            pool.push(m);
        }
    }
}

impl Drop for Compiled {
    fn drop(&mut self) {
        let n = self.pool.get_mut().len();
        self.pooled.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A place in a [`Grammar`](super::Grammar): which tokens may come next, and the tokens taken
/// so far. The engine keeps one per constrained sequence; hosts may walk one to check a token
/// sequence against a grammar ([`Grammar::matcher`](super::Grammar::matcher)).
pub struct GrammarMatcher {
    /// The matcher over the whole vocabulary (`None` only while it is given back on drop).
    whole: Option<Matcher>,
    compiled: Arc<Compiled>,
    parts: Option<Arc<MaskParts>>,
    /// One matcher per part of the vocabulary (made on the first split mask), and how many of
    /// `taken` each has consumed.
    split: Vec<(Matcher, usize)>,
    /// Every token taken (kept only when masks can be split).
    taken: Vec<u32>,
    /// Tokens handed over by [`defer`](Self::defer), taken at the next mask.
    deferred: Vec<u32>,
    split_next: bool,
    masks_split: u64,
    vocab_size: usize,
    /// Set when tokens taken ahead could not be rolled back ([`forced`](Self::forced)): the
    /// matcher is no longer where its output is, and every later mask fails with this.
    broken: Option<String>,
}

impl std::fmt::Debug for GrammarMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMatcher")
            .field("stopped", &self.whole.as_ref().map(Matcher::is_stopped))
            .finish()
    }
}

/// `set` as mask words: bit `t % 32` of word `t / 32`, as many words as `vocab_size` needs.
fn mask_words(set: &SimpleVob, vocab_size: usize) -> Vec<u32> {
    let mut words = set.as_slice().to_vec();
    words.resize(vocab_size.div_ceil(32), 0);
    words
}

fn grammar_error(e: impl std::fmt::Display) -> Error {
    Error::Grammar(format!("the grammar failed: {e}"))
}

impl GrammarMatcher {
    pub(super) fn new(
        compiled: Arc<Compiled>,
        parts: Option<Arc<MaskParts>>,
        vocab_size: usize,
    ) -> Self {
        let (whole, split) = compiled
            .take()
            .unwrap_or_else(|| (Matcher::new(Ok(compiled.template.deep_clone())), Vec::new()));
        Self {
            whole: Some(whole),
            compiled,
            parts,
            split: split.into_iter().map(|m| (m, 0)).collect(),
            taken: Vec::new(),
            deferred: Vec::new(),
            split_next: false,
            masks_split: 0,
            vocab_size,
            broken: None,
        }
    }

    /// The tokens allowed next, one bit per token id (bit `t % 32` of word `t / 32`; as many
    /// words as the vocabulary needs): only the end-of-sequence token once the grammar is
    /// complete and admits nothing more. A mask that follows a wide one is computed
    /// by one thread per part of the vocabulary ([`GrammarCompiler::with_mask_parts`](super::GrammarCompiler::with_mask_parts)):
    /// the same mask, sooner.
    pub fn mask(&mut self) -> Result<Vec<u32>> {
        self.mask_with(true)
    }

    /// [`mask`](Self::mask), split in parts only if `may_split` (a caller computing many rows'
    /// masks at once keeps its threads busy with whole masks: splitting costs each part a
    /// walk's fixed work).
    pub fn mask_with(&mut self, may_split: bool) -> Result<Vec<u32>> {
        self.not_broken()?;
        self.take_deferred()?;
        let set = match self.parts.clone() {
            Some(parts) if self.split_next && may_split => {
                self.masks_split += 1;
                self.split_mask(&parts)?
            }
            _ => self.whole().compute_mask_or_eos().map_err(grammar_error)?,
        };
        self.split_next = self.parts.is_some() && set.num_set() > SPLIT_ABOVE_ALLOWED;
        let out = mask_words(&set, self.vocab_size);
        if out.iter().all(|&w| w == 0) {
            return Err(Error::Grammar("the grammar allows no token here".into()));
        }
        Ok(out)
    }

    /// The error of a matcher whose forced tokens could not be rolled back, if it is one.
    fn not_broken(&self) -> Result<()> {
        match &self.broken {
            Some(e) => Err(Error::Grammar(e.clone())),
            None => Ok(()),
        }
    }

    fn whole(&mut self) -> &mut Matcher {
        self.whole
            .as_mut()
            .expect("a matcher has its whole-vocabulary matcher until it is dropped")
    }

    /// How many threads this matcher's next mask would take if allowed to split (the parts of
    /// the vocabulary after a wide mask; 1 otherwise).
    pub(crate) fn next_mask_threads(&self) -> usize {
        match &self.parts {
            Some(p) if self.split_next => p.computers.len(),
            _ => 1,
        }
    }

    /// How many of this matcher's masks were computed split in parts.
    pub fn masks_split(&self) -> u64 {
        self.masks_split
    }

    /// The union of the parts' masks, each part's matcher brought up to the tokens taken.
    fn split_mask(&mut self, parts: &MaskParts) -> Result<SimpleVob> {
        use rayon::prelude::*;
        if self.split.is_empty() {
            self.split = parts
                .computers
                .iter()
                .map(|c| {
                    let mut p = self.compiled.template.deep_clone();
                    p.bias_computer = c.clone();
                    (Matcher::new(Ok(p)), 0)
                })
                .collect();
        }
        let taken = &self.taken;
        let masks: Vec<SimpleVob> = self
            .split
            .par_iter_mut()
            .map(|(m, n)| {
                if *n < taken.len() {
                    m.consume_tokens(&taken[*n..]).map_err(grammar_error)?;
                    *n = taken.len();
                }
                m.compute_mask_or_eos().map_err(grammar_error)
            })
            .collect::<Result<_>>()?;
        Ok(parts.union(&masks))
    }

    /// The tokens the grammar forces from here (each the only token its mask allows; at most
    /// `max`, never an end-of-sequence token), and the masks of the positions they are drawn
    /// at followed by the mask after them: `masks.len() == tokens.len() + 1` when there are
    /// forced tokens, both empty otherwise. The matcher stays where it is (the forced tokens
    /// are taken and rolled back).
    pub(crate) fn forced(
        &mut self,
        max: usize,
        is_eos: impl Fn(u32) -> bool,
    ) -> Result<(Vec<u32>, Vec<Vec<u32>>)> {
        self.not_broken()?;
        self.take_deferred()?;
        let vocab_size = self.vocab_size;
        let (mut tokens, mut masks) = (Vec::new(), Vec::new());
        let m = self.whole();
        let walked: Result<()> = (|| {
            loop {
                let set = m.compute_mask_or_eos().map_err(grammar_error)?;
                let mask = mask_words(&set, vocab_size);
                let only = (set.num_set() == 1)
                    .then(|| set.first_bit_set())
                    .flatten()
                    .map(|t| t as u32);
                masks.push(mask);
                match only {
                    Some(t) if !is_eos(t) && tokens.len() < max => {
                        m.consume_token(t).map_err(grammar_error)?;
                        tokens.push(t);
                    }
                    _ => return Ok(()),
                }
            }
        })();
        if !tokens.is_empty()
            && let Err(e) = m.rollback(tokens.len())
        {
            let e = format!("the grammar could not take back tokens it forced: {e}");
            self.broken = Some(e.clone());
            return Err(Error::Grammar(e));
        }
        walked?;
        if tokens.is_empty() {
            masks.clear();
        }
        Ok((tokens, masks))
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
        self.whole()
            .consume_token(token)
            .map_err(|e| Error::Grammar(format!("the grammar refused token {token}: {e}")))?;
        if self.parts.is_some() {
            self.taken.push(token);
        }
        Ok(())
    }

    /// Hands `token` over to be taken ([`consume`](Self::consume)) at the next mask: the
    /// engine's rows take their tokens on the threads that compute their masks, not one
    /// after another on the scheduler's. A refusal is the next mask's error.
    pub(crate) fn defer(&mut self, token: u32) {
        self.deferred.push(token);
    }

    /// Takes the tokens handed over by [`defer`](Self::defer).
    fn take_deferred(&mut self) -> Result<()> {
        for t in std::mem::take(&mut self.deferred) {
            self.consume(t)?;
        }
        Ok(())
    }

    /// Whether the output so far is a complete sentence of the grammar (the end-of-sequence
    /// token may come next).
    pub fn is_complete(&mut self) -> bool {
        if self.take_deferred().is_err() {
            return false;
        }
        self.whole().is_accepting().unwrap_or(false)
    }
}

impl Drop for GrammarMatcher {
    /// Rewinds the matchers to the grammar's start and gives them back to the grammar, for
    /// the next output (unless one of them failed, or the grammar keeps enough).
    fn drop(&mut self) {
        if self.broken.is_some()
            || self.compiled.pool.lock().len() >= POOLED
            || self.compiled.pooled.load(Ordering::Relaxed) >= POOLED_PER_COMPILER
        {
            return;
        }
        let Some(mut whole) = self.whole.take() else {
            return;
        };
        let split = std::mem::take(&mut self.split);
        if whole.is_error() || whole.reset().is_err() {
            return;
        }
        let mut rewound = Vec::with_capacity(split.len());
        for (mut m, _) in split {
            if m.is_error() || m.reset().is_err() {
                return;
            }
            rewound.push(m);
        }
        self.compiled.give_back((whole, rewound));
    }
}
