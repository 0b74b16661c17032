//! CPU time of one grammar mask per row (what constrained decoding adds to a step for each
//! constrained row): the real Qwen3 tokenizer, `tool_choice` required over the three tools of
//! tests/fixtures/tools/nested.json, masks computed along two valid calls token by token (as
//! llguidance walks them, and with the bounded-string shortcut, whole and split), and the
//! one-off cost of the grammar compiler and of compiling the grammar.
//!
//! `cargo bench --bench grammar`

use criterion::{Criterion, criterion_group, criterion_main};
use policy_serve::grammar::{MaskOptions, machine_mask_parts};
use policy_serve::{GrammarCompiler, OutputConstraint, ResponseFormat, ToolChoice, ToolDefinition};

fn masks(c: &mut Criterion) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let tokenizer =
        tokenizers::Tokenizer::from_file(root.join("tests/fixtures/qwen3/tokenizer.json"))
            .expect("tokenizer fixture");
    let tools = ToolDefinition::list_from_json(
        &std::fs::read_to_string(root.join("tests/fixtures/tools/nested.json")).unwrap(),
    )
    .unwrap();
    // Two calls: a short string ("ana", maxLength 8), and one that fills a maxLength-10
    // string with ASCII and a multi-byte character.
    let calls = [
        "<tool_call>\n{\"name\": \"update\", \"arguments\": {\"id\": 4211, \"fields\": {\"name\": \"ana\", \"active\": true}}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"answer\", \"arguments\": {\"value\": \"caf\u{e9} 12 ab\", \"score\": 3}}\n</tool_call>",
    ];
    let walks: Vec<Vec<u32>> = calls
        .iter()
        .map(|call| tokenizer.encode(*call, false).unwrap().get_ids().to_vec())
        .collect();
    let n: u32 = walks.iter().map(|w| w.len() as u32).sum();
    let required = OutputConstraint::tools(ToolChoice::Required);
    // Masks as llguidance walks them (the bounded-string shortcut off), then with the
    // shortcut: one thread per mask (the CPU time a row costs), then split in parts, one
    // thread per part (the time a row waits for its mask).
    let configs = [
        ("walked", 1, false),
        ("bounded", 1, true),
        ("bounded, split", machine_mask_parts(), true),
    ];
    for (name, parts, bounded_strings) in configs {
        let t = std::time::Instant::now();
        let options = MaskOptions {
            parts,
            bounded_strings,
        };
        let compiler =
            GrammarCompiler::with_options(&tokenizer, 151_936, 151_645, options).unwrap();
        println!(
            "[{name}] grammar compiler over 151,936 tokens, masks in {} part(s): {:.1} ms",
            compiler.mask_parts(),
            t.elapsed().as_secs_f64() * 1e3
        );
        let t = std::time::Instant::now();
        let grammar = required.compile(&compiler, &tools, false).unwrap();
        println!(
            "[{name}] three-tool grammar compiled in {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        // The slowest positions of the walks (inside the strings with maxLength): the first
        // walks (fresh matchers), then those of matchers rewound and reused.
        for walk in ["first", "reused"] {
            let mut slow = Vec::new();
            for ids in &walks {
                let mut m = grammar.matcher();
                for &tok in ids {
                    let t = std::time::Instant::now();
                    std::hint::black_box(m.mask().unwrap());
                    slow.push((
                        t.elapsed().as_micros(),
                        tokenizer.decode(&[tok], false).unwrap(),
                    ));
                    m.consume(tok).unwrap();
                }
            }
            if walk == "first" {
                // Positions where the grammar allows exactly one token: what fast-forwarding
                // forced tokens (appended without a draw, several per forward) could skip.
                let forced: usize = walks
                    .iter()
                    .map(|ids| {
                        let mut m = grammar.matcher();
                        ids.iter()
                            .filter(|&&tok| {
                                let one = m
                                    .mask()
                                    .unwrap()
                                    .iter()
                                    .map(|w| w.count_ones())
                                    .sum::<u32>()
                                    == 1;
                                m.consume(tok).unwrap();
                                one
                            })
                            .count()
                    })
                    .sum();
                println!("[{name}] forced positions: {forced} of {n}");
            }
            let total: u128 = slow.iter().map(|s| s.0).sum();
            slow.sort_by_key(|s| std::cmp::Reverse(s.0));
            println!(
                "[{name}] {walk} walks: {total} us in all; slowest masks (us, the token taken after): {:?}",
                &slow[..3]
            );
        }
        // An unbounded string (no maxLength), where llguidance's own slice applies: the
        // shortcut must leave it at once.
        let note = OutputConstraint::json(ResponseFormat::JsonSchema(serde_json::json!({
            "type": "object",
            "properties": {"note": {"type": "string"}},
            "required": ["note"]
        })))
        .compile(&compiler, &[], false)
        .unwrap();
        let text = "{\"note\": \"The quick brown fox jumps over the lazy dog, twice: once at dawn and once at dusk.\"}";
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let mut per_round = Vec::new();
        for _ in 0..5 {
            let mut m = note.matcher();
            let t = std::time::Instant::now();
            for &tok in &ids {
                std::hint::black_box(m.mask().unwrap());
                m.consume(tok).unwrap();
            }
            per_round.push(t.elapsed().as_secs_f64() * 1e6 / ids.len() as f64);
        }
        println!(
            "[{name}] an unbounded string's answer ({} tokens): {:.0} us a mask (best of 5 walks)",
            ids.len(),
            per_round.iter().cloned().fold(f64::MAX, f64::min)
        );
        // Memory of matchers as an engine holds them: 64 walked at once, then given back to
        // the grammar's pool (resident set growth; Linux).
        let rss = || -> f64 {
            let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
                * 4096.0
                / 1e6
        };
        let before = rss();
        {
            // More at once than the grammar has rewound: most are new matchers.
            let mut ms: Vec<_> = (0..64).map(|_| grammar.matcher()).collect();
            let t = std::time::Instant::now();
            for m in &mut ms {
                for &tok in &walks[1] {
                    std::hint::black_box(m.mask().unwrap());
                    m.consume(tok).unwrap();
                }
            }
            println!(
                "[{name}] 64 matchers at once along the second call: {:.0} us a mask; +{:.1} MB",
                t.elapsed().as_secs_f64() * 1e6 / (64 * walks[1].len()) as f64,
                rss() - before
            );
        }
        println!("[{name}] 64 matchers pooled: +{:.1} MB", rss() - before);
        // The engine's work per constrained row per step: the mask, then the sampled token
        // taken. Timed per mask: walks along both calls divided by their length (matchers
        // made untimed).
        c.bench_function(
            &format!("mask + consume per row, {name}, masks in {parts} part(s) (mean over the {n} tokens of two calls)"),
            |b| {
                b.iter_custom(|iters| {
                    let mut matchers: Vec<_> =
                        (0..iters * 2).map(|_| grammar.matcher()).collect();
                    let t = std::time::Instant::now();
                    for (i, m) in matchers.iter_mut().enumerate() {
                        for &tok in &walks[i % 2] {
                            std::hint::black_box(m.mask().unwrap());
                            m.consume(tok).unwrap();
                        }
                    }
                    t.elapsed() * 2 / n
                })
            },
        );
    }
}

criterion_group!(benches, masks);
criterion_main!(benches);
