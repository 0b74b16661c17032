//! Grammar-constrained decoding: a [`Grammar`] (compiled once, cheap to clone) constrains what
//! a request may generate; the engine keeps one matcher per constrained sequence, computes each
//! step's token mask on CPU threads while the GPU runs the step's forward, and masks the logits
//! on the device before any draw.
//!
//! The grammar engine is llguidance (MIT; Microsoft's structured-output engine behind guidance,
//! also used by vLLM, SGLang and mistral.rs) over a [`TokenizerEnv`](llguidance::toktrie::TokenizerEnv)
//! of our own on the model's already-loaded `tokenizers` tokenizer (`vocab`). Grammars are in
//! llguidance's Lark dialect (`%json {schema}` for JSON Schema, `<tool_call>` for an added
//! token); `policy::format::constraint` writes the ones for tool calls and JSON answers.
//!
//! Invariants: a grammar that does not compile within [`GrammarCompiler::timeout`] is an error,
//! never a hang; a [`Grammar`] is immutable (each request starts its own matcher from it).

mod bounded;
mod split;
mod state;
mod vocab;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use llguidance::ParserFactory;
use llguidance::api::TopLevelGrammar;
use llguidance::earley::BiasComputer;
use parking_lot::Mutex;
use split::MaskParts;
use tokenizers::Tokenizer;

use state::Compiled;
pub use state::GrammarMatcher;

use crate::error::{Error, Result};

/// A compiled grammar: what a [`GenerationRequest`](crate::GenerationRequest) may generate.
/// Cheap to clone; two grammars are equal when their sources are.
#[derive(Clone)]
pub struct Grammar {
    source: Arc<str>,
    compiled: Arc<Compiled>,
    parts: Option<Arc<MaskParts>>,
    vocab_size: usize,
}

impl Grammar {
    /// The Lark source it was compiled from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The size of the vocabulary it was compiled for (the logits of its engine's model).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// A matcher at the start of the grammar (the engine starts one per constrained request).
    pub fn matcher(&self) -> GrammarMatcher {
        GrammarMatcher::new(self.compiled.clone(), self.parts.clone(), self.vocab_size)
    }
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("source", &self.source)
            .finish()
    }
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// In how many parts a long mask is split unless told: 1, never. With masks inside bounded
/// strings by the room left ([`MaskOptions::bounded_strings`]) no mask is wide enough for
/// splitting to pay: on the H200 host (16 threads) whole masks took 17-36 us a row on average
/// against 40-72 us split in 8, the slowest 0.3-0.4 ms against 0.8-3.3 ms, and constrained
/// decode ran 0-9% faster whole (BENCHMARKS.md, #26).
pub fn default_mask_parts() -> usize {
    1
}

/// In how many parts a long mask may usefully be split on this machine: its threads, at
/// most 8 (for [`GrammarCompiler::with_mask_parts`] where a caller wants splitting).
pub fn machine_mask_parts() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
}

/// How a [`GrammarCompiler`] computes masks: the same masks whatever the options, sooner or
/// later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskOptions {
    /// In how many parts of the vocabulary (by the tokens' first two bytes) a wide mask is
    /// computed at once, one thread each. 0 or 1: never split.
    pub parts: usize,
    /// Inside a JSON string with `maxLength`, mask the tokens by how many characters they are
    /// (tokens of up to the room left allowed at once, longer ones never walked) instead of
    /// walking every token longer than the room left (1-2.5 ms a mask on Qwen3's vocabulary).
    /// On unless turned off for a comparison.
    pub bounded_strings: bool,
}

impl Default for MaskOptions {
    /// [`default_mask_parts`], the bounded-string shortcut on.
    fn default() -> Self {
        Self {
            parts: default_mask_parts(),
            bounded_strings: true,
        }
    }
}

/// llguidance's slices (token sets it ORs into a mask instead of walking them: JSON string
/// content) plus string content of at most 1..=9 characters, so that inside a string with a
/// `maxLength` the tokens that fit the remaining length are not walked either.
fn slices() -> Vec<String> {
    let mut slices = llguidance::earley::SlicedBiasComputer::json_slices();
    if !slices.iter().any(|s| s == UNBOUNDED_STRING) {
        slices.push(UNBOUNDED_STRING.into());
    }
    for k in 1..=9 {
        slices.push(format!(r#"[^"\\\x00-\x1F\x7F]{{1,{k}}}"#));
    }
    slices
}

/// Unbounded JSON string content: llguidance's slice for it, which [`bounded`] leaves to
/// llguidance.
const UNBOUNDED_STRING: &str = r#"[^"\\\x00-\x1F\x7F]+"#;

/// The index of [`UNBOUNDED_STRING`] among `slices` (the parsers' extra lexemes).
fn unbounded_slice(slices: &[String]) -> usize {
    slices
        .iter()
        .position(|s| s == UNBOUNDED_STRING)
        .expect("slices() holds the unbounded string slice")
}

/// Most compiled grammars kept for reuse (an episode's turns compile the same one).
const CACHED_GRAMMARS: usize = 256;

/// Compiles grammars for one model's tokenizer. Building it walks the whole vocabulary, and
/// each mask part its own tokens, in parallel (1.3-1.7 s for Qwen3's 152k tokens in 8 parts
/// on the H200 host); the engine builds one on the first constrained request.
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    /// The bias computer its parsers use over the whole vocabulary (`None`: the factory's).
    whole: Option<Arc<dyn BiasComputer>>,
    parts: Option<Arc<MaskParts>>,
    cache: Mutex<HashMap<Arc<str>, Arc<Compiled>>>,
    /// Rewound matchers its grammars keep, together (at most `state::POOLED_PER_COMPILER`).
    pooled: Arc<std::sync::atomic::AtomicUsize>,
    timeout: Duration,
    vocab_size: usize,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("cached", &self.cache.lock().len())
            .field("timeout", &self.timeout)
            .field("mask_parts", &self.mask_parts())
            .finish()
    }
}

impl GrammarCompiler {
    /// A compiler over `tokenizer`'s vocabulary for a model of `vocab_size` logits whose
    /// generation ends with `eos` (the token a complete grammar allows), its masks split in
    /// [`default_mask_parts`] parts.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, eos: u32) -> Result<Self> {
        Self::with_mask_parts(tokenizer, vocab_size, eos, default_mask_parts())
    }

    /// [`new`](Self::new) with the vocabulary cut in `parts` parts (by the tokens' first
    /// two bytes) for masks that take long: such a row's mask is computed by up to `parts` threads
    /// at once, each over its part, and is the same mask. 0 or 1: never split.
    pub fn with_mask_parts(
        tokenizer: &Tokenizer,
        vocab_size: usize,
        eos: u32,
        parts: usize,
    ) -> Result<Self> {
        Self::with_options(
            tokenizer,
            vocab_size,
            eos,
            MaskOptions {
                parts,
                ..MaskOptions::default()
            },
        )
    }

    /// [`new`](Self::new) with its masks computed as `options` say.
    pub fn with_options(
        tokenizer: &Tokenizer,
        vocab_size: usize,
        eos: u32,
        options: MaskOptions,
    ) -> Result<Self> {
        let started = std::time::Instant::now();
        let words = vocab::token_bytes(tokenizer, vocab_size)?;
        let tokenizer = Arc::new(tokenizer.clone());
        let env: llguidance::toktrie::TokEnv =
            Arc::new(vocab::TokenEnv::from_words(&words, tokenizer.clone(), eos)?);
        let slices = slices();
        let mut factory = ParserFactory::new(&env, Default::default(), &slices)
            .map_err(|e| Error::Grammar(e.to_string()))?;
        factory.quiet();
        // The shortcut, with the index of the slice it leaves to llguidance.
        let bounded = options.bounded_strings.then(|| unbounded_slice(&slices));
        let whole = bounded.map(|unbounded| {
            Arc::new(bounded::Bounded::new(factory.slicer(), unbounded)) as Arc<dyn BiasComputer>
        });
        let parts =
            MaskParts::new(&words, &tokenizer, eos, &slices, options.parts, bounded)?.map(Arc::new);
        tracing::info!(
            vocab_size,
            mask_parts = parts.as_ref().map_or(1, |p| p.computers.len()),
            bounded_strings = options.bounded_strings,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "grammar compiler ready"
        );
        Ok(Self {
            factory: Arc::new(factory),
            whole,
            parts,
            cache: Mutex::new(HashMap::new()),
            pooled: Arc::default(),
            timeout: Duration::from_secs(5),
            vocab_size,
        })
    }

    /// The same compiler with another limit on the time one grammar may take to compile.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many finished matchers, rewound, this compiler's grammars keep for the next outputs
    /// (together at most 256, at most 64 a grammar).
    pub fn pooled_matchers(&self) -> usize {
        self.pooled.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// In how many parts a long mask is split (1: never split).
    pub fn mask_parts(&self) -> usize {
        self.parts.as_ref().map_or(1, |p| p.computers.len())
    }

    /// The limit on the time one grammar may take to compile (5 s unless set).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Compiles a grammar in llguidance's Lark dialect; the error says what the grammar engine
    /// refused (an unsupported JSON Schema keyword, an unknown token, a grammar too large) or
    /// that it did not compile within the time limit.
    pub fn compile(&self, lark: &str) -> Result<Grammar> {
        if let Some(compiled) = self.cache.lock().get(lark) {
            return Ok(Grammar {
                source: lark.into(),
                compiled: compiled.clone(),
                parts: self.parts.clone(),
                vocab_size: self.vocab_size,
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let factory = self.factory.clone();
        let whole = self.whole.clone();
        let source = lark.to_string();
        // A thread of its own, so that a grammar that compiles too long is given up on (it
        // finishes in the background, bounded by llguidance's own fuel limits).
        std::thread::Builder::new()
            .name("grammar-compile".into())
            .spawn(move || {
                let parsed = factory
                    .create_parser(TopLevelGrammar::from_lark(source))
                    .map(|mut p| {
                        if let Some(whole) = whole {
                            p.bias_computer = whole;
                        }
                        p
                    });
                let _ = tx.send(parsed.map_err(|e| e.to_string()));
            })
            .map_err(|e| Error::Grammar(format!("cannot start the compile thread: {e}")))?;
        let compiled = match rx.recv_timeout(self.timeout) {
            Ok(Ok(p)) => Arc::new(Compiled::new(p, self.pooled.clone())),
            Ok(Err(e)) => return Err(Error::Grammar(e)),
            Err(_) => {
                return Err(Error::Grammar(format!(
                    "the grammar did not compile within {:?}; simplify the schema",
                    self.timeout
                )));
            }
        };
        let source: Arc<str> = lark.into();
        let mut cache = self.cache.lock();
        if cache.len() >= CACHED_GRAMMARS {
            cache.clear();
        }
        cache.insert(source.clone(), compiled.clone());
        Ok(Grammar {
            source,
            compiled,
            parts: self.parts.clone(),
            vocab_size: self.vocab_size,
        })
    }
}
