//! Grammar masks with the bounded-string shortcut (`MaskOptions::bounded_strings`: inside a
//! JSON string with `maxLength`, tokens that fit the room left allowed at once, longer ones
//! never walked) equal llguidance's own walk, token for token, on the real Qwen3 tokenizer:
//! random walks through tool calls, JSON answers with bounded, unbounded, patterned and
//! enumerated strings (ASCII and multi-byte), and a Lark grammar whose lexeme may end inside string
//! content, with the masks whole and split in parts. And the tokens a grammar forces,
//! fast-forwarded as drafts, are the tokens of decoding one at a time.
//!
//! Mutations caught (each run): the tokens of one character more than the room allowed
//! (`upto[room + 1]`), the room counted in bytes instead of characters. The check that no
//! lexeme may end where the room runs out is not reached by these walks (llguidance ends the
//! Lark grammar's regex lexeme itself once it cannot grow); `grammar::bounded`'s unit test
//! catches its removal on a toy automaton.

use policy_serve::engine::SpeculativeOptions;
use policy_serve::grammar::MaskOptions;
use policy_serve::{GrammarCompiler, OutputConstraint, ResponseFormat, ToolChoice};
use serde_json::json;

use super::*;

fn compiler(parts: usize, bounded_strings: bool) -> GrammarCompiler {
    let tokenizer =
        tokenizers::Tokenizer::from_file(common::fixtures().join("qwen3/tokenizer.json")).unwrap();
    GrammarCompiler::with_options(
        &tokenizer,
        151_936,
        151_645,
        MaskOptions {
            parts,
            bounded_strings,
        },
    )
    .unwrap()
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn allowed(mask: &[u32]) -> Vec<u32> {
    (0..mask.len() as u32 * 32)
        .filter(|&t| (mask[t as usize / 32] >> (t % 32)) & 1 == 1)
        .collect()
}

#[test]
fn bounded_string_masks_equal_llguidances_walk() {
    let plain = compiler(1, false);
    let fast = [compiler(1, true), compiler(3, true)];
    let tools = constrained::tools();
    let schema = json!({
        "type": "object",
        "properties": {
            "a": {"type": "string", "maxLength": 3},
            "b": {"type": "string", "minLength": 2, "maxLength": 12},
            "c": {"type": "string", "pattern": "^[a-z]{0,6}$"},
            "d": {"type": "string", "maxLength": 40},
            "e": {"enum": ["ab", "abc", "\u{e9}t\u{e9}"]},
            "f": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
            "h": {"type": "string"}
        },
        "required": ["a", "b", "c", "d", "e", "f", "h"]
    });
    let sources = [
        OutputConstraint::tools(ToolChoice::Required)
            .grammar(&tools, false)
            .unwrap(),
        OutputConstraint::json(ResponseFormat::JsonSchema(schema))
            .grammar(&[], false)
            .unwrap(),
        // The regex lexeme accepts after 1-5 characters, and `>` (string content) may
        // follow it: where its room runs out, a `>` token starts the next lexeme.
        "start: \"<\" /[^\"\\\\\\x00-\\x1F\\x7F]{1,5}/ \">\" \"!\"\n".to_string(),
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut masks, mut in_strings) = (0usize, 0usize);
    for (g, source) in sources.iter().enumerate() {
        let reference = plain.compile(source).unwrap();
        let grammars: Vec<_> = fast.iter().map(|c| c.compile(source).unwrap()).collect();
        for walk in 0..12 {
            let mut m0 = reference.matcher();
            let mut ms: Vec<_> = grammars.iter().map(|g| g.matcher()).collect();
            for step in 0..80 {
                let mask = m0.mask().unwrap();
                for (k, m) in ms.iter_mut().enumerate() {
                    assert!(
                        m.mask().unwrap() == mask,
                        "grammar {g}, walk {walk}, step {step}, compiler {k}: masks differ"
                    );
                }
                masks += 1;
                let ok = allowed(&mask);
                if ok.len() > 1000 {
                    in_strings += 1;
                }
                if ok == [151_645] {
                    break;
                }
                // Mostly any allowed token (long string content fills the room quickly),
                // sometimes one of the lowest ids (single characters: to stop at every room
                // left).
                let pick = if rng.next().is_multiple_of(3) {
                    ok[(rng.next() % ok.len().min(64) as u64) as usize]
                } else {
                    ok[(rng.next() % ok.len() as u64) as usize]
                };
                if pick == 151_645 {
                    break;
                }
                m0.consume(pick).unwrap();
                for m in &mut ms {
                    m.consume(pick).unwrap();
                }
            }
        }
    }
    // The walks went through strings, not only around them.
    assert!(in_strings * 4 > masks, "{in_strings} of {masks} masks wide");
}

/// Forced tokens fast-forwarded (`EngineOptions::grammar_fast_forward`: the tokens a grammar
/// forces go into a step as drafts, each kept by its masked draw) give the tokens of decoding
/// one at a time, in fewer steps: six sampled and one greedy constrained request and one
/// unconstrained, batched, with speculation on (the greedy unconstrained row drafts n-grams
/// in the same steps). Mutations caught: a draft row masked with the next position's mask
/// (the draw refuses the draft: other tokens), the row after the drafts masked as before
/// them (tokens the grammar refuses: a failed request), drafts made but not verified (no
/// fewer steps).
#[test]
fn forced_tokens_fast_forwarded_are_the_tokens_of_one_at_a_time() {
    let run = |fast_forward: bool| {
        let engine = common::tiny_registry(EngineOptions {
            grammar_fast_forward: fast_forward,
            // Eight requests run at once (the default fast-forwards up to four).
            grammar_fast_forward_max_batch: 8,
            speculative: Some(SpeculativeOptions::default()),
            ..options()
        })
        .model("tiny")
        .unwrap()
        .engine()
        .clone();
        let grammar = constrained::compile(
            &engine,
            &OutputConstraint::tools(ToolChoice::Required),
            &constrained::tools(),
        );
        let tokens = constrained::batch_tokens(
            &engine,
            &grammar,
            8,
            |i| i < 7,
            |i| if i == 7 { 20 } else { 80 },
        );
        let st = engine.stats();
        (tokens, st.steps, st.spec_accepted_tokens)
    };
    let (plain, plain_steps, plain_kept) = run(false);
    let (fast, fast_steps, fast_kept) = run(true);
    assert_eq!(plain, fast);
    assert!(
        fast_kept > plain_kept + 50,
        "{fast_kept} drafts kept with fast-forward, {plain_kept} without"
    );
    assert!(
        fast_steps * 100 < plain_steps * 85,
        "{fast_steps} steps with fast-forward, {plain_steps} without"
    );
}
