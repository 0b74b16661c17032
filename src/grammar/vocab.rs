//! The vocabulary as the grammar engine sees it: the bytes of every token of the model's
//! `tokenizers` tokenizer, and llguidance's [`TokenizerEnv`] over that tokenizer.
//!
//! Invariants: there is one entry per logits column (`vocab_size`, which may exceed the
//! tokenizer's: the extra ids have no bytes and are never allowed); every added token
//! (`<|im_end|>`, `<tool_call>`, `<think>`, ...) is marked special (llguidance's `0xFF` prefix),
//! so free text can never spell one and a grammar names it as `<tool_call>`; the other tokens
//! are their byte-level BPE bytes.

use std::sync::Arc;

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// llguidance's view of the model's tokenizer.
pub(crate) struct TokenEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenEnv {
    /// The environment of `words` (the bytes of each logits column, [`token_bytes`]) whose
    /// end-of-sequence token is `eos` (what a grammar that is complete allows); `tokenizer`
    /// splits grammar literals.
    pub(crate) fn from_words(
        words: &[Vec<u8>],
        tokenizer: Arc<Tokenizer>,
        eos: u32,
    ) -> Result<Self> {
        if eos as usize >= words.len() {
            return Err(Error::InvalidInput(format!(
                "the end-of-sequence token {eos} is outside the vocabulary of {}",
                words.len()
            )));
        }
        let info = TokRxInfo::new(words.len() as u32, eos);
        Ok(Self {
            trie: TokTrie::from(&info, words),
            tokenizer,
        })
    }
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Text as the model's tokenizer splits it (grammar literals); bytes that are not UTF-8
    /// (never in a literal of ours) by the longest tokens of the trie.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s).ok().and_then(|text| {
            self.tokenizer
                .encode(text, false)
                .ok()
                .map(|e| e.get_ids().to_vec())
        }) {
            Some(ids) => ids,
            None => self.trie.greedy_tokenize(s),
        }
    }
}

/// Byte-level BPE's printable stand-in for each byte (GPT-2's table): printable Latin-1 bytes
/// stand for themselves, the others for the characters from U+0100 on, in byte order. Returns
/// the byte of each stand-in character.
fn byte_of_char() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    let mut map = std::collections::HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

/// The bytes of every token id below `vocab_size` (added tokens with the special marker;
/// ids the tokenizer does not have: empty).
pub(crate) fn token_bytes(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Vec<Vec<u8>>> {
    let vocab = tokenizer.get_vocab(false);
    let added = tokenizer.get_added_tokens_decoder();
    let biggest = vocab
        .values()
        .chain(added.keys())
        .copied()
        .max()
        .unwrap_or(0) as usize;
    if biggest >= vocab_size {
        return Err(Error::InvalidInput(format!(
            "the tokenizer has token id {biggest} but the model has only {vocab_size} logits"
        )));
    }
    let bytes = byte_of_char();
    let mut words = vec![Vec::new(); vocab_size];
    for (piece, &id) in &vocab {
        let word: Option<Vec<u8>> = piece.chars().map(|c| bytes.get(&c).copied()).collect();
        words[id as usize] = word.ok_or_else(|| {
            Error::InvalidInput(format!(
                "constrained decoding needs a byte-level BPE tokenizer (as Qwen3's); token {id} ({piece:?}) is not byte-level"
            ))
        })?;
    }
    for (&id, token) in &added {
        let mut word = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        word.extend_from_slice(token.content.as_bytes());
        words[id as usize] = word;
    }
    Ok(words)
}
