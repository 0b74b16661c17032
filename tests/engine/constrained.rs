//! Grammar-constrained decoding through the public API: `OutputConstraint` compiled by the
//! engine's `grammar_compiler`, carried by `GenerationRequest::grammar`. The tiny random model
//! sampling at temperature 1 writes garbage unless constrained, which makes it the control:
//! without the grammar almost nothing parses; with it everything does, and validates against
//! the tools' schemas (checked by `boon`, a JSON-schema validator that is not the grammar
//! engine).
//!
//! Mutations these tests catch: a mask not applied (or applied to the wrong row), a matcher
//! not fed the sampled token, added tokens not marked special (free text could spell
//! `<tool_call>`), the wrong separators (the parser would still read the call, but the
//! soundness walk over `json.dumps` text fails).

use policy_serve::engine::Engine;
use policy_serve::{
    Error, Grammar, GrammarCompiler, OutputConstraint, ResponseFormat, ToolChoice, ToolDefinition,
    parse_output,
};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

const TOOL_CALL: u32 = 151657;

fn engine() -> Engine {
    common::tiny_registry(options())
        .model("tiny")
        .unwrap()
        .engine()
        .clone()
}

/// Three tools with nested schemas (tests/fixtures/tools/nested.json, also what `bench
/// --constrained` and the grammar bench use): enums, bounded integers, arrays, nested
/// objects, required and optional fields.
pub(crate) fn tools() -> Vec<ToolDefinition> {
    let path = common::fixtures().join("tools/nested.json");
    ToolDefinition::list_from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub(crate) fn compile(engine: &Engine, c: &OutputConstraint, tools: &[ToolDefinition]) -> Grammar {
    c.compile(engine.grammar_compiler().unwrap(), tools, false)
        .unwrap()
}

/// `n` sampled requests (seeds 0..n) on one prompt, each with `grammar`.
fn sampled(engine: &Engine, grammar: Option<&Grammar>, n: u64, cap: usize) -> Vec<String> {
    let pending: Vec<_> = (0..n)
        .map(|seed| {
            let mut r = GenerationRequest::new(prompt(12, 5))
                .sampling(SamplingParams {
                    temperature: 1.0,
                    seed,
                    ..SamplingParams::greedy()
                })
                .max_new_tokens(cap);
            r.grammar = grammar.cloned();
            engine.submit(r)
        })
        .collect();
    pending
        .into_iter()
        .map(|p| p.wait().unwrap().text)
        .collect()
}

/// Whether `args` validate against `schema` (boon, draft 2020-12).
fn validates(schema: &Value, args: &Value) -> bool {
    let mut schemas = boon::Schemas::new();
    let mut compiler = boon::Compiler::new();
    compiler
        .add_resource("mem:///s.json", schema.clone())
        .unwrap();
    let id = compiler.compile("mem:///s.json", &mut schemas).unwrap();
    schemas.validate(args, id).is_ok()
}

/// Whether `text` is one or more calls of `tools` whose arguments validate.
fn valid_calls(text: &str, tools: &[ToolDefinition]) -> bool {
    let p = parse_output(text, Some(tools));
    p.error.is_none()
        && !p.calls.is_empty()
        && p.calls.iter().all(|c| {
            let tool = tools.iter().find(|t| t.name() == c.name).unwrap();
            validates(
                &tool.function.parameters,
                &Value::Object(c.arguments.clone()),
            )
        })
}

#[test]
fn required_calls_parse_and_validate_for_200_seeds_and_do_not_without_the_grammar() {
    let engine = engine();
    let tools = tools();
    let grammar = compile(
        &engine,
        &OutputConstraint::tools(ToolChoice::Required),
        &tools,
    );
    let outs = sampled(&engine, Some(&grammar), 200, 400);
    let bad: Vec<&String> = outs.iter().filter(|t| !valid_calls(t, &tools)).collect();
    assert!(
        bad.is_empty(),
        "{} of 200 invalid, e.g. {:?}",
        bad.len(),
        bad.first()
    );
    let names: std::collections::HashSet<String> = outs
        .iter()
        .flat_map(|t| parse_output(t, Some(&tools)).calls)
        .map(|c| c.name)
        .collect();
    assert_eq!(
        names.len(),
        3,
        "every tool is called by some seed: {names:?}"
    );
    // The control: the same requests unconstrained are garbage.
    let free = sampled(&engine, None, 50, 60);
    let ok = free.iter().filter(|t| valid_calls(t, &tools)).count();
    assert_eq!(
        ok, 0,
        "unconstrained random output should not hold valid calls"
    );
}

#[test]
fn a_named_function_is_the_only_call() {
    let engine = engine();
    let tools = tools();
    let named = OutputConstraint::tools(ToolChoice::Function("update".into()));
    let grammar = compile(&engine, &named, &tools);
    for text in sampled(&engine, Some(&grammar), 40, 200) {
        let p = parse_output(&text, Some(&tools));
        assert!(valid_calls(&text, &tools), "{text:?}");
        assert_eq!(p.calls.len(), 1, "{text:?}");
        assert_eq!(p.calls[0].name, "update");
    }
}

#[test]
fn json_answers_validate_against_the_response_schema() {
    let engine = engine();
    let schema = json!({"type": "object", "properties": {
        "verdict": {"enum": ["yes", "no"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 50},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}},
        "required": ["verdict", "count"], "additionalProperties": false});
    let c = OutputConstraint::json(ResponseFormat::JsonSchema(schema.clone()));
    let grammar = compile(&engine, &c, &[]);
    for text in sampled(&engine, Some(&grammar), 40, 200) {
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(validates(&schema, &v), "{text}");
    }
    let object = compile(
        &engine,
        &OutputConstraint::json(ResponseFormat::JsonObject),
        &[],
    );
    for text in sampled(&engine, Some(&object), 10, 300) {
        // An object may be cut by the cap; every one that ended is an object.
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            assert!(v.is_object(), "{text}");
        } else {
            assert!(text.starts_with('{'), "{text:?}");
        }
    }
}

#[test]
fn none_never_allows_a_call_and_auto_allows_text_or_a_call() {
    let engine = engine();
    let tools = tools();
    let none = compile(&engine, &OutputConstraint::tools(ToolChoice::None), &tools);
    let auto = compile(&engine, &OutputConstraint::tools(ToolChoice::Auto), &tools);
    let text = engine.tokenize("Let me look that up.").unwrap();
    let (mut n, mut a) = (none.matcher(), auto.matcher());
    assert!(
        a.allows(TOOL_CALL).unwrap(),
        "auto: a call may open at once"
    );
    assert!(!n.allows(TOOL_CALL).unwrap());
    for &t in &text {
        n.consume(t).unwrap();
        a.consume(t).unwrap();
        assert!(!n.allows(TOOL_CALL).unwrap(), "none: never a call");
    }
    assert!(a.allows(TOOL_CALL).unwrap(), "auto: a call may follow text");
    assert!(
        n.is_complete() && a.is_complete(),
        "text alone is a whole answer"
    );
    // Free text cannot spell the tag out of pieces either (the parser would read it).
    assert_eq!(engine.tokenize("<tool_call>").unwrap(), vec![TOOL_CALL]);
    let spelled: Vec<u32> = ["Hi ", "<", "tool", "_call", ">"]
        .iter()
        .flat_map(|p| engine.tokenize(p).unwrap())
        .collect();
    let (allowed, _) = walk(&none, &spelled);
    assert!(
        allowed >= 2 && allowed < spelled.len(),
        "{allowed} of {spelled:?}"
    );
    // Sampled `auto` answers are text or valid calls, never a broken call.
    let g = compile(&engine, &OutputConstraint::tools(ToolChoice::Auto), &tools);
    for text in sampled(&engine, Some(&g), 20, 120) {
        let p = parse_output(&text, Some(&tools));
        assert!(
            p.calls.is_empty() && !text.contains("<tool_call>") || valid_calls(&text, &tools),
            "{text:?}"
        );
    }
}

#[test]
fn unconstrained_requests_beside_constrained_ones_keep_their_greedy_tokens() {
    let engine = engine();
    let tools = tools();
    let grammar = compile(
        &engine,
        &OutputConstraint::tools(ToolChoice::Required),
        &tools,
    );
    let plain = |i: u32| GenerationRequest::new(prompt(10, 40 + i)).max_new_tokens(12);
    let alone: Vec<Vec<u32>> = (0..4)
        .map(|i| engine.generate(plain(i)).unwrap().tokens)
        .collect();
    let mut pending = Vec::new();
    for i in 0..4 {
        let mut c = plain(100 + i);
        c.grammar = Some(grammar.clone());
        pending.push(engine.submit(c));
        pending.push(engine.submit(plain(i)));
    }
    let out: Vec<_> = pending.into_iter().map(|p| p.wait().unwrap()).collect();
    for i in 0..4 {
        assert_eq!(out[2 * i + 1].tokens, alone[i], "request {i}");
        assert!(out[2 * i].text.starts_with("<tool_call>\n{\"name\": \""));
    }
}

#[test]
fn refusals_name_what_is_wrong() {
    let engine = engine();
    let compiler = engine.grammar_compiler().unwrap();
    let mut tools = tools();
    // A keyword the grammar engine does not implement (`not`), in the second tool.
    let bad = ToolDefinition::from_json(
        &json!({"type": "function", "function": {"name": "strange", "parameters": {
            "type": "object", "properties": {"x": {"type": "string", "not": {"const": "a"}}}}}})
        .to_string(),
    )
    .unwrap();
    tools.insert(1, bad);
    let err = OutputConstraint::tools(ToolChoice::Required)
        .compile(compiler, &tools, false)
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Grammar(_)), "{msg}");
    assert!(
        msg.contains("tool `strange`") && msg.contains("not"),
        "{msg}"
    );
    let err = OutputConstraint::tools(ToolChoice::Function("nope".into()))
        .compile(compiler, &tools, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`nope`") && err.contains("query"), "{err}");
    let err = OutputConstraint::tools(ToolChoice::Required)
        .compile(compiler, &[], false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs tools"), "{err}");
    // A compile that takes longer than its limit is given up on.
    let slow = GrammarCompiler::new(engine.tokenizer(), engine.info().vocab_size, 151645)
        .unwrap()
        .with_timeout(std::time::Duration::from_micros(1));
    let many: Vec<String> = (0..4000)
        .map(|i| format!("value number {i} of many"))
        .collect();
    let err = OutputConstraint::json(ResponseFormat::JsonSchema(json!({"enum": many})))
        .compile(&slow, &[], false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("did not compile within"), "{err}");
    // min_tokens would fight the grammar over where the answer ends.
    let mut r = GenerationRequest::new(prompt(5, 1)).max_new_tokens(8);
    r.grammar = Some(compile(
        &engine,
        &OutputConstraint::tools(ToolChoice::Auto),
        &[],
    ));
    r.min_tokens = 2;
    let err = engine.generate(r).unwrap_err().to_string();
    assert!(err.contains("min_tokens"), "{err}");
}

/// Argument objects valid against the `query` tool's schema.
fn query_args() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["users", "orders", "items"]),
        prop::option::of(1u32..=100),
        prop::collection::vec(prop::sample::select(vec!["id", "name", "price"]), 1..=3),
    )
        .prop_map(|(table, limit, columns)| {
            let mut m = serde_json::Map::new();
            m.insert("table".into(), json!(table));
            if let Some(l) = limit {
                m.insert("limit".into(), json!(l));
            }
            m.insert("columns".into(), json!(columns));
            Value::Object(m)
        })
}

/// A call as the chat template writes it (`json.dumps` separators).
fn call_text(args: &Value) -> String {
    let body = json!({"name": "query", "arguments": args});
    let text = serde_json::to_string(&body)
        .unwrap()
        .replace("\":", "\": ")
        .replace(",\"", ", \"");
    format!("<tool_call>\n{text}\n</tool_call>")
}

/// Walks `tokens` through `g`: how many tokens it allowed in a row, and whether the whole
/// sequence was allowed and complete.
fn walk(g: &Grammar, tokens: &[u32]) -> (usize, bool) {
    let mut m = g.matcher();
    for (i, &t) in tokens.iter().enumerate() {
        if !m.allows(t).unwrap() {
            return (i, false);
        }
        m.consume(t).unwrap();
    }
    (tokens.len(), m.is_complete())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The mask is sound and complete on these samples: a call valid against the schema is
    /// allowed token by token and complete at its end; a mutated call is allowed to the end
    /// exactly when it is still a valid call (parsed and validated without the grammar, keys in
    /// the schema's order).
    #[test]
    fn the_mask_allows_exactly_the_valid_calls(
        args in query_args(),
        at in 0usize..200,
        edit in prop::sample::select(vec!["\"", "}", "9", "x", " ", ", ", "\"limit\": 3, "]),
        delete in any::<bool>(),
    ) {
        static ENGINE: std::sync::OnceLock<(Engine, Grammar)> = std::sync::OnceLock::new();
        let (engine, grammar) = ENGINE.get_or_init(|| {
            let e = engine();
            let tools: Vec<ToolDefinition> = tools().into_iter().take(1).collect();
            let g = compile(&e, &OutputConstraint::tools(ToolChoice::Function("query".into())), &tools);
            (e, g)
        });
        let tools: Vec<ToolDefinition> = tools().into_iter().take(1).collect();
        let text = call_text(&args);
        let (n, ok) = walk(grammar, &engine.tokenize(&text).unwrap());
        prop_assert!(ok, "valid call refused after {n} tokens: {text}");
        // Mutate inside the JSON (after `<tool_call>\n`, before `\n</tool_call>`).
        let json_start = "<tool_call>\n".len();
        let json_end = text.len() - "\n</tool_call>".len();
        let pos = json_start + at % (json_end - json_start);
        let mut mutated = text.clone();
        if delete {
            mutated.remove(pos);
        } else {
            mutated.insert_str(pos, edit);
        }
        // Valid, written as json.dumps writes it, and with the arguments' keys in the
        // schema's order (the grammar writes an object's properties in that order, as the
        // chat template's callers do; `"limit": 3` moved before `"table"` is refused).
        let still_valid = valid_calls(&mutated, &tools) && {
            let args: Value = parse_output(&mutated, Some(&tools)).calls[0].arguments.clone().into();
            let keys: Vec<&str> = args.as_object().map_or(vec![], |o| o.keys().map(String::as_str).collect());
            let schema_order: Vec<&str> = ["table", "limit", "columns"]
                .into_iter()
                .filter(|k| keys.contains(k))
                .collect();
            keys == schema_order && mutated == call_text(&args)
        };
        let (_, accepted) = walk(grammar, &engine.tokenize(&mutated).unwrap());
        prop_assert_eq!(accepted, still_valid, "{}", mutated);
    }
}

/// The tokens of `n` requests submitted together (prompts of 10 + i tokens): the first six
/// sampled at temperature 1 (seed i), the rest greedy; request i carries `grammar` when
/// `constrained(i)` and takes at most `cap(i)` new tokens.
pub(crate) fn batch_tokens(
    engine: &Engine,
    grammar: &Grammar,
    n: u64,
    constrained: impl Fn(u64) -> bool,
    cap: impl Fn(u64) -> usize,
) -> Vec<Vec<u32>> {
    let pending: Vec<_> = (0..n)
        .map(|i| {
            let mut r = GenerationRequest::new(prompt(10 + i as usize, 3)).max_new_tokens(cap(i));
            if i < 6 {
                r = r.sampling(SamplingParams {
                    temperature: 1.0,
                    seed: i,
                    ..SamplingParams::greedy()
                });
            }
            if constrained(i) {
                r.grammar = Some(grammar.clone());
            }
            engine.submit(r)
        })
        .collect();
    pending
        .into_iter()
        .map(|p| p.wait().unwrap().tokens)
        .collect()
}

/// Constrained rows decode pipelined (the next step's forward queued before this step's
/// tokens are read; its masks computed once they are, while that forward runs) and get the
/// tokens of unpipelined decoding: six sampled constrained requests and two greedy
/// unconstrained ones at once, on an engine with and one without pipelined decode. Mutations
/// caught: masks computed before the grammars took the step in flight's tokens (stale by one
/// token: other tokens, or a refused one), constrained rows kept out of pipelining (no
/// pipelined steps).
#[test]
fn constrained_rows_pipelined_get_the_tokens_of_unpipelined_decoding() {
    let run = |pipelined: bool, speculative, n: u64| {
        let engine = common::tiny_registry(EngineOptions {
            pipelined_decode: pipelined,
            speculative,
            ..options()
        })
        .model("tiny")
        .unwrap()
        .engine()
        .clone();
        let grammar = compile(
            &engine,
            &OutputConstraint::tools(ToolChoice::Required),
            &tools(),
        );
        let tokens = batch_tokens(&engine, &grammar, n, |i| i < 6, |_| 60);
        (tokens, engine.stats().pipelined_steps)
    };
    let (plain, plain_steps) = run(false, None, 8);
    let (piped, piped_steps) = run(true, None, 8);
    assert_eq!(plain_steps, 0);
    assert!(piped_steps > 10, "only {piped_steps} pipelined steps");
    assert_eq!(plain, piped);
    // Speculation on (the default): constrained rows never draft, so a batch of them alone
    // still pipelines (mutation: any speculating engine refusing to pipeline).
    let spec = Some(policy_serve::engine::SpeculativeOptions::default());
    let (alone, alone_steps) = run(true, spec, 6);
    assert!(alone_steps > 10, "only {alone_steps} pipelined steps");
    assert_eq!(alone, plain[..6].to_vec());
}

/// A mask split in parts (one thread each) is the mask of the whole vocabulary, and a matcher
/// rewound for the next output (taken from the grammar's pool) masks as a fresh one: every
/// position of calls of the three tools (strings with `maxLength`, whose wide masks are the
/// ones split) compared with a compiler that never splits, three times over, the later walks
/// with the matchers the first one gave back, the last also with a copy of one (the pool
/// empty). Mutations caught: a part's mask left out of the union, the sentinel left in, parts
/// not brought up to the tokens taken, a rewound matcher (or its copy) that keeps its place.
#[test]
fn split_and_rewound_masks_are_the_whole_masks() {
    let engine = engine();
    let (vocab, eos) = (engine.info().vocab_size, 151_645);
    let whole = GrammarCompiler::with_mask_parts(engine.tokenizer(), vocab, eos, 1).unwrap();
    let split = GrammarCompiler::with_mask_parts(engine.tokenizer(), vocab, eos, 4).unwrap();
    assert_eq!((whole.mask_parts(), split.mask_parts()), (1, 4));
    let required = OutputConstraint::tools(ToolChoice::Required);
    let (gw, gs) = (
        required.compile(&whole, &tools(), false).unwrap(),
        required.compile(&split, &tools(), false).unwrap(),
    );
    let calls = [
        r#"{"name": "update", "arguments": {"id": 42, "fields": {"name": "ana b", "active": true}}}"#,
        r#"{"name": "answer", "arguments": {"value": "\"x\" été", "score": -3}}"#,
        r#"{"name": "answer", "arguments": {"value": "0123456789"}}"#,
    ];
    let mut split_masks = 0;
    for round in 0..3 {
        for call in calls {
            let ids = engine
                .tokenize(&format!("<tool_call>\n{call}\n</tool_call>"))
                .unwrap();
            let (mut mw, mut ms) = (gw.matcher(), gs.matcher());
            // In the last round, two at once: the pool holds one, so the second is a copy of
            // the last matcher given back.
            let mut copy = (round == 2).then(|| gs.matcher());
            for (i, &t) in ids.iter().enumerate() {
                let mask = mw.mask().unwrap();
                assert_eq!(mask, ms.mask().unwrap(), "round {round}, {call}, token {i}");
                if let Some(c) = copy.as_mut() {
                    assert_eq!(mask, c.mask().unwrap(), "copy, {call}, token {i}");
                    c.consume(t).unwrap();
                }
                mw.consume(t).unwrap();
                ms.consume(t).unwrap();
            }
            assert!(mw.is_complete() && ms.is_complete());
            assert_eq!(mw.masks_split(), 0);
            split_masks += ms.masks_split();
        }
    }
    assert!(split_masks >= 6, "only {split_masks} masks were split");
}

/// Finished matchers are kept, rewound, for the next outputs: at most 64 a grammar and 256
/// for all the grammars of a compiler (a server cycling through many tool sets keeps no
/// more); one taken from a pool is counted out. Mutation caught: a pool without the
/// compiler-wide cap (320 kept).
#[test]
fn finished_matchers_are_kept_within_the_compilers_cap() {
    let engine = engine();
    let (vocab, eos) = (engine.info().vocab_size, 151_645);
    let compiler = GrammarCompiler::with_mask_parts(engine.tokenizer(), vocab, eos, 1).unwrap();
    let all = tools();
    let grammars: Vec<Grammar> = (0..5)
        .map(|i| {
            // Five distinct grammars: each tool alone, two tools, and all three.
            let set: Vec<ToolDefinition> = match i {
                0..=2 => vec![all[i].clone()],
                3 => all[..2].to_vec(),
                _ => all.clone(),
            };
            OutputConstraint::tools(ToolChoice::Required)
                .compile(&compiler, &set, false)
                .unwrap()
        })
        .collect();
    for g in &grammars[..1] {
        let matchers: Vec<_> = (0..80).map(|_| g.matcher()).collect();
        drop(matchers);
    }
    assert_eq!(compiler.pooled_matchers(), 64, "at most 64 a grammar");
    for g in &grammars[1..] {
        let matchers: Vec<_> = (0..64).map(|_| g.matcher()).collect();
        drop(matchers);
    }
    assert_eq!(compiler.pooled_matchers(), 256, "at most 256 a compiler");
    // A matcher taken from a pool is counted out; given back, in again.
    let m = grammars[0].matcher();
    assert_eq!(compiler.pooled_matchers(), 255);
    drop(m);
    assert_eq!(compiler.pooled_matchers(), 256);
}

#[test]
fn a_constrained_episode_acts_with_valid_calls_every_step() {
    let registry = common::tiny_registry(options());
    let episode = policy_serve::EpisodeConfig {
        temperature: Some(1.0),
        seed: Some(11),
        max_new_tokens: Some(300),
        ..policy_serve::EpisodeConfig::with_tools(tools())
    }
    .constrain(OutputConstraint::tools(ToolChoice::Required));
    let mut policy = registry.get_policy("tiny", episode).unwrap();
    let mut observation: policy_serve::Observation = "Find the newest order".into();
    for _ in 0..3 {
        let step = policy.act(observation).unwrap();
        let policy_serve::Action::Call { calls, .. } = &step.action else {
            panic!("not a call: {:?}", step.raw);
        };
        assert!(valid_calls(&step.raw, &tools()), "{:?}", step.raw);
        observation = policy_serve::Observation::ToolResults(
            calls.iter().map(|c| format!("ran {}", c.name)).collect(),
        );
    }
}
