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

mod state;
mod vocab;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use llguidance::api::TopLevelGrammar;
use llguidance::{ParserFactory, TokenParser};
use parking_lot::Mutex;
use tokenizers::Tokenizer;

pub use state::GrammarMatcher;

use crate::error::{Error, Result};

/// A compiled grammar: what a [`GenerationRequest`](crate::GenerationRequest) may generate.
/// Cheap to clone; two grammars are equal when their sources are.
#[derive(Clone)]
pub struct Grammar {
    source: Arc<str>,
    parser: Arc<TokenParser>,
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
        GrammarMatcher::new(
            llguidance::Matcher::new(Ok(self.parser.deep_clone())),
            self.vocab_size,
        )
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

/// Most compiled grammars kept for reuse (an episode's turns compile the same one).
const CACHED_GRAMMARS: usize = 256;

/// Compiles grammars for one model's tokenizer. Building it walks the whole vocabulary
/// (~0.1-0.5 s for Qwen3's 152k tokens); the engine builds one on the first constrained request.
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    cache: Mutex<HashMap<Arc<str>, Arc<TokenParser>>>,
    timeout: Duration,
    vocab_size: usize,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler")
            .field("cached", &self.cache.lock().len())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl GrammarCompiler {
    /// A compiler over `tokenizer`'s vocabulary for a model of `vocab_size` logits whose
    /// generation ends with `eos` (the token a complete grammar allows).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, eos: u32) -> Result<Self> {
        let started = std::time::Instant::now();
        let env: llguidance::toktrie::TokEnv =
            Arc::new(vocab::TokenEnv::new(tokenizer, vocab_size, eos)?);
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| Error::Grammar(e.to_string()))?;
        factory.quiet();
        tracing::info!(
            vocab_size,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "grammar compiler ready"
        );
        Ok(Self {
            factory: Arc::new(factory),
            cache: Mutex::new(HashMap::new()),
            timeout: Duration::from_secs(5),
            vocab_size,
        })
    }

    /// The same compiler with another limit on the time one grammar may take to compile.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The limit on the time one grammar may take to compile (5 s unless set).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Compiles a grammar in llguidance's Lark dialect; the error says what the grammar engine
    /// refused (an unsupported JSON Schema keyword, an unknown token, a grammar too large) or
    /// that it did not compile within the time limit.
    pub fn compile(&self, lark: &str) -> Result<Grammar> {
        if let Some(parser) = self.cache.lock().get(lark) {
            return Ok(Grammar {
                source: lark.into(),
                parser: parser.clone(),
                vocab_size: self.vocab_size,
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let factory = self.factory.clone();
        let source = lark.to_string();
        // A thread of its own, so that a grammar that compiles too long is given up on (it
        // finishes in the background, bounded by llguidance's own fuel limits).
        std::thread::Builder::new()
            .name("grammar-compile".into())
            .spawn(move || {
                let parsed = factory.create_parser(TopLevelGrammar::from_lark(source));
                let _ = tx.send(parsed.map_err(|e| e.to_string()));
            })
            .map_err(|e| Error::Grammar(format!("cannot start the compile thread: {e}")))?;
        let parser = match rx.recv_timeout(self.timeout) {
            Ok(Ok(p)) => Arc::new(p),
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
        cache.insert(source.clone(), parser.clone());
        Ok(Grammar {
            source,
            parser,
            vocab_size: self.vocab_size,
        })
    }
}
