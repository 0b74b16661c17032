//! Incremental detokenization: each new token decodes only a short window (the previous
//! token's context and the new tokens), not the whole output.
//!
//! Invariant: `text()` is exactly what decoding every fed token at once gives, except for a
//! trailing incomplete UTF-8 character, which is held back until the token that completes it
//! (or `finish`) arrives.

use tokenizers::Tokenizer;

/// The decoded text of a growing token sequence.
#[derive(Debug, Clone, Default)]
pub(crate) struct Detokenizer {
    tokens: Vec<u32>,
    /// Start of the window decoded as context for the next piece.
    prefix_offset: usize,
    /// Tokens already turned into text.
    read_offset: usize,
    text: String,
}

impl Detokenizer {
    /// The stable text so far.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// Adds one token; returns how many bytes of text it made stable.
    pub(crate) fn push(&mut self, tok: &Tokenizer, token: u32) -> usize {
        self.tokens.push(token);
        self.advance(tok, false)
    }

    /// Flushes a trailing incomplete character (the output ended); returns the bytes added.
    pub(crate) fn finish(&mut self, tok: &Tokenizer) -> usize {
        self.advance(tok, true)
    }

    fn advance(&mut self, tok: &Tokenizer, last: bool) -> usize {
        let decode = |ids: &[u32]| tok.decode(ids, false).unwrap_or_default();
        let before = decode(&self.tokens[self.prefix_offset..self.read_offset]);
        let now = decode(&self.tokens[self.prefix_offset..]);
        if !now.starts_with(&before) {
            // A decoder that rewrites earlier text: fall back to decoding everything once.
            let all = decode(&self.tokens);
            let added = all.len().saturating_sub(self.text.len());
            self.text = all;
            self.prefix_offset = self.read_offset;
            self.read_offset = self.tokens.len();
            return added;
        }
        if now.len() == before.len() || (!last && now.ends_with('\u{FFFD}')) {
            return 0;
        }
        self.text.push_str(&now[before.len()..]);
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        now.len() - before.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/qwen3/tokenizer.json"
        );
        Tokenizer::from_file(path).expect("fixture tokenizer")
    }

    #[test]
    fn incremental_text_equals_decoding_everything_at_once() {
        let tok = tokenizer();
        let text = "Hello, wörld! 你好 🦀 <tool_call>\n{\"name\": \"q\"}\n</tool_call> ok";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        let mut d = Detokenizer::default();
        for &t in &ids {
            d.push(&tok, t);
            assert!(!d.text().contains('\u{FFFD}'), "held back: {:?}", d.text());
        }
        d.finish(&tok);
        assert_eq!(d.text(), tok.decode(&ids, false).unwrap());
        assert_eq!(d.text(), text);
    }

    #[test]
    fn a_split_multibyte_character_is_held_back_until_complete() {
        let tok = tokenizer();
        // Byte-level tokens of one emoji, fed one by one.
        let ids = tok.encode("🦀", false).unwrap().get_ids().to_vec();
        let mut d = Detokenizer::default();
        let mut added = 0;
        for &t in &ids {
            added += d.push(&tok, t);
        }
        assert_eq!(d.text(), "🦀");
        assert_eq!(added, "🦀".len());
    }
}
