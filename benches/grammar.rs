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
    let t = std::time::Instant::now();
    let compiler = GrammarCompiler::new(&tokenizer, 151_936, 151_645).unwrap();
    println!(
        "grammar compiler over 151,936 tokens: {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let required = OutputConstraint::tools(ToolChoice::Required);
    let t = std::time::Instant::now();
    let grammar = required.compile(&compiler, &tools, false).unwrap();
    println!(
        "three-tool grammar compiled in {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let call = "<tool_call>\n{\"name\": \"update\", \"arguments\": {\"id\": 4211, \"fields\": {\"name\": \"ana\", \"active\": true}}}\n</tool_call>";
    let ids = tokenizer.encode(call, false).unwrap().get_ids().to_vec();
    // The engine's work per constrained row per step: the mask, then the sampled token taken.
    // Timed per mask: a walk along the call divided by its length (matchers made untimed).
    let n = ids.len() as u32;
    c.bench_function(
        &format!("mask + consume per row (mean over the {n} tokens of a call)"),
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

criterion_group!(benches, masks);
criterion_main!(benches);
