//! CPU time of one grammar mask per row (what constrained decoding adds to a step for each
//! constrained row): the real Qwen3 tokenizer, `tool_choice` required over the three tools of
//! tests/fixtures/tools/nested.json, masks computed along a valid call token by token, and the
//! one-off cost of the grammar compiler and of compiling the grammar.
//!
//! `cargo bench --bench grammar`

use criterion::{Criterion, criterion_group, criterion_main};
use policy_serve::{GrammarCompiler, OutputConstraint, ToolChoice, ToolDefinition};

fn masks(c: &mut Criterion) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let tokenizer =
        tokenizers::Tokenizer::from_file(root.join("tests/fixtures/qwen3/tokenizer.json"))
            .expect("tokenizer fixture");
    let tools = ToolDefinition::list_from_json(
        &std::fs::read_to_string(root.join("tests/fixtures/tools/nested.json")).unwrap(),
    )
    .unwrap();
    let call = "<tool_call>\n{\"name\": \"update\", \"arguments\": {\"id\": 4211, \"fields\": {\"name\": \"ana\", \"active\": true}}}\n</tool_call>";
    let ids = tokenizer.encode(call, false).unwrap().get_ids().to_vec();
    let n = ids.len() as u32;
    let required = OutputConstraint::tools(ToolChoice::Required);
    // Parts 1: one thread per mask (the CPU time a row costs); then the masks split in parts,
    // one thread per part (the time a row waits for its mask).
    for parts in [1, policy_serve::grammar::default_mask_parts()] {
        let t = std::time::Instant::now();
        let compiler =
            GrammarCompiler::with_mask_parts(&tokenizer, 151_936, 151_645, parts).unwrap();
        println!(
            "grammar compiler over 151,936 tokens, masks in {} part(s): {:.1} ms",
            compiler.mask_parts(),
            t.elapsed().as_secs_f64() * 1e3
        );
        let t = std::time::Instant::now();
        let grammar = required.compile(&compiler, &tools, false).unwrap();
        println!(
            "three-tool grammar compiled in {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        // The slowest positions of a walk (inside the strings with maxLength): the first walk
        // (a fresh matcher), then one of a matcher rewound and reused.
        for walk in ["first", "reused"] {
            let mut m = grammar.matcher();
            let mut slow = Vec::new();
            for &tok in &ids {
                let t = std::time::Instant::now();
                std::hint::black_box(m.mask().unwrap());
                slow.push((
                    t.elapsed().as_micros(),
                    tokenizer.decode(&[tok], false).unwrap(),
                ));
                m.consume(tok).unwrap();
            }
            let total: u128 = slow.iter().map(|s| s.0).sum();
            slow.sort_by_key(|s| std::cmp::Reverse(s.0));
            println!(
                "{walk} walk: {total} us in all; slowest masks (us, the token taken after): {:?}",
                &slow[..3]
            );
        }
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
            let mut ms: Vec<_> = (0..64).map(|_| grammar.matcher()).collect();
            for m in &mut ms {
                for &tok in &ids {
                    std::hint::black_box(m.mask().unwrap());
                    m.consume(tok).unwrap();
                }
            }
            println!("64 matchers walked: +{:.1} MB", rss() - before);
        }
        println!("64 matchers pooled: +{:.1} MB", rss() - before);
        // The engine's work per constrained row per step: the mask, then the sampled token
        // taken. Timed per mask: a walk along the call divided by its length (matchers made
        // untimed).
        c.bench_function(
            &format!("mask + consume per row, masks in {parts} part(s) (mean over the {n} tokens of a call)"),
            |b| {
                b.iter_custom(|iters| {
                    let mut matchers: Vec<_> = (0..iters).map(|_| grammar.matcher()).collect();
                    let t = std::time::Instant::now();
                    for m in &mut matchers {
                        for &tok in &ids {
                            std::hint::black_box(m.mask().unwrap());
                            m.consume(tok).unwrap();
                        }
                    }
                    t.elapsed() / n
                })
            },
        );
    }
}

criterion_group!(benches, masks);
criterion_main!(benches);
