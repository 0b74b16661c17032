//! The tool-call parser: accepted shapes, readable errors, validation against tool schemas,
//! round trip with the template, and no panic on any input.

use policy_serve::Action;
use policy_serve::policy::format::{
    ChatTemplate, Message, RenderOptions, ToolCall, ToolDefinition, format_tool_calls, parse_output,
};
use proptest::prelude::*;
use serde_json::json;

fn tools() -> Vec<ToolDefinition> {
    ToolDefinition::list_from_json(
        &json!([
            {"type": "function", "function": {"name": "query", "description": "Run SQL",
              "parameters": {"type": "object", "properties": {"sql": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["sql"]}}},
            {"type": "function", "function": {"name": "answer", "description": "Answer",
              "parameters": {"type": "object", "properties": {"value": {"type": "string"}, "unit": {"type": "string", "enum": ["m", "km"]}}, "required": ["value"], "additionalProperties": false}}}
        ])
        .to_string(),
    )
    .unwrap()
}

#[test]
fn a_single_call_with_object_arguments_parses() {
    let p = parse_output(
        "<tool_call>\n{\"name\": \"query\", \"arguments\": {\"sql\": \"SELECT 1\"}}\n</tool_call>",
        Some(&tools()),
    );
    assert_eq!(p.error, None);
    assert_eq!(p.calls.len(), 1);
    assert_eq!(p.calls[0].name, "query");
    assert_eq!(p.calls[0].arguments["sql"], "SELECT 1");
    assert_eq!(p.content, "");
}

#[test]
fn arguments_as_a_json_string_are_decoded() {
    let p = parse_output(
        r#"<tool_call>{"name": "query", "arguments": "{\"sql\": \"SELECT 2\", \"limit\": 3}"}</tool_call>"#,
        Some(&tools()),
    );
    assert_eq!(p.error, None);
    assert_eq!(p.calls[0].arguments["limit"], 3);
}

#[test]
fn several_calls_and_surrounding_text_are_kept() {
    let raw = "Let me check.\n<tool_call>\n{\"name\": \"query\", \"arguments\": {\"sql\": \"a\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"query\", \"arguments\": {\"sql\": \"b\"}}\n</tool_call>\nDone.";
    let p = parse_output(raw, Some(&tools()));
    assert_eq!(p.error, None);
    assert_eq!(
        p.calls
            .iter()
            .map(|c| c.arguments["sql"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(p.content, "Let me check.\nDone.");
}

#[test]
fn an_unclosed_trailing_call_and_whitespace_variants_parse() {
    let p = parse_output(
        "<tool_call>  \n\t{\"name\":\"query\",\"arguments\":{\"sql\":\"x\"}}   ",
        Some(&tools()),
    );
    assert_eq!(p.error, None, "{p:?}");
    assert_eq!(p.calls[0].name, "query");
}

#[test]
fn a_think_block_is_split_off_as_reasoning() {
    let p = parse_output(
        "<think>\nI should query.\n</think>\n\n<tool_call>\n{\"name\": \"query\", \"arguments\": {\"sql\": \"x\"}}\n</tool_call>",
        None,
    );
    assert_eq!(p.reasoning.as_deref(), Some("I should query."));
    assert_eq!(p.calls.len(), 1);
    let unclosed = parse_output("<think>\nstill thinking", None);
    assert!(unclosed.error.unwrap().contains("<think>"));
}

#[test]
fn malformed_output_becomes_invalid_with_a_readable_reason() {
    let cases = [
        (
            "<tool_call>\n{\"name\": \"query\", \"arguments\": {\"sql\": }\n</tool_call>",
            "not valid JSON",
        ),
        (
            "<tool_call>\n[1, 2]\n</tool_call>",
            "expected a JSON object",
        ),
        (
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            "missing \"name\"",
        ),
        (
            "<tool_call>\n{\"name\": \"query\"}\n</tool_call>",
            "no \"arguments\"",
        ),
        (
            "<tool_call>\n{\"name\": \"query\", \"arguments\": \"[1]\"}\n</tool_call>",
            "not an object",
        ),
        ("<tool_call>\n</tool_call>", "empty <tool_call>"),
        ("text </tool_call>", "without a matching"),
        (
            "<tool_call>\n{\"name\": \"drop_db\", \"arguments\": {}}\n</tool_call>",
            "unknown tool `drop_db`",
        ),
        (
            "<tool_call>\n{\"name\": \"query\", \"arguments\": {}}\n</tool_call>",
            "misses required argument `sql`",
        ),
        (
            "<tool_call>\n{\"name\": \"query\", \"arguments\": {\"sql\": 5}}\n</tool_call>",
            "expected string, got number",
        ),
        (
            "<tool_call>\n{\"name\": \"query\", \"arguments\": {\"sql\": \"x\", \"limit\": 1.5}}\n</tool_call>",
            "expected integer",
        ),
        (
            "<tool_call>\n{\"name\": \"answer\", \"arguments\": {\"value\": \"x\", \"unit\": \"mi\"}}\n</tool_call>",
            "is not one of",
        ),
        (
            "<tool_call>\n{\"name\": \"answer\", \"arguments\": {\"value\": \"x\", \"extra\": 1}}\n</tool_call>",
            "unknown argument `extra`",
        ),
    ];
    for (raw, reason) in cases {
        let action = parse_output(raw, Some(&tools())).into_action(raw);
        match action {
            Action::Invalid { raw: r, error } => {
                assert_eq!(r, raw);
                assert!(
                    error.contains(reason),
                    "{raw:?}: {error:?} should mention {reason:?}"
                );
            }
            other => panic!("{raw:?} should be invalid, got {other:?}"),
        }
    }
}

#[test]
fn plain_text_is_a_reply_and_empty_output_is_invalid() {
    assert_eq!(
        parse_output("The answer is 4.", None).into_action("The answer is 4."),
        Action::Reply {
            content: "The answer is 4.".into()
        }
    );
    assert!(matches!(
        parse_output("  ", None).into_action("  "),
        Action::Invalid { .. }
    ));
}

#[test]
fn what_the_template_renders_for_a_tool_call_parses_back_to_the_same_call() {
    let template = ChatTemplate::from_model_dir(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen3"),
    )
    .unwrap();
    let call = ToolCall {
        name: "query".into(),
        arguments: json!({"sql": "SELECT \"x\" — ü", "limit": 2, "opts": {"a": [1.5, null]}})
            .as_object()
            .unwrap()
            .clone(),
    };
    let msgs = [
        Message::user("q"),
        Message::assistant_with_calls("", vec![call.to_message_call()]),
    ];
    let rendered = template
        .render(
            &msgs,
            None,
            RenderOptions {
                add_generation_prompt: false,
                enable_thinking: None,
            },
        )
        .unwrap();
    let start = rendered.find("<|im_start|>assistant\n").unwrap() + "<|im_start|>assistant\n".len();
    let end = rendered.rfind("<|im_end|>").unwrap();
    let body = &rendered[start..end];
    // The last assistant turn after the query carries Qwen3's empty think block first.
    assert_eq!(
        body,
        format!(
            "<think>\n\n</think>\n\n{}",
            format_tool_calls(std::slice::from_ref(&call))
        )
    );
    let parsed = parse_output(body, None);
    assert_eq!(parsed.error, None);
    assert_eq!(parsed.calls, vec![call]);
}

proptest! {
    #[test]
    fn the_parser_never_panics_on_arbitrary_text(s in ".{0,300}") {
        let _ = parse_output(&s, Some(&tools())).into_action(&s);
    }

    #[test]
    fn the_parser_never_panics_on_tag_soup(parts in prop::collection::vec(prop_oneof![
        Just("<tool_call>".to_string()), Just("</tool_call>".to_string()), Just("<think>".to_string()),
        Just("</think>".to_string()), Just("{\"name\": \"query\", \"arguments\": {\"sql\": \"x\"}}".to_string()),
        Just("{".to_string()), Just("\"".to_string()), ".{0,10}"], 0..12)) {
        let s = parts.concat();
        let p = parse_output(&s, Some(&tools()));
        if p.error.is_none() {
            for c in &p.calls { prop_assert!(c.name == "query"); }
        }
    }

    #[test]
    fn formatted_calls_round_trip(sql in ".{0,40}", limit in any::<i32>()) {
        let call = ToolCall { name: "query".into(), arguments: json!({"sql": sql, "limit": limit}).as_object().unwrap().clone() };
        let raw = format_tool_calls(&[call.clone(), call.clone()]);
        let p = parse_output(&raw, Some(&tools()));
        prop_assert_eq!(p.error, None);
        prop_assert_eq!(p.calls, vec![call.clone(), call]);
    }
}

#[test]
fn a_closing_tag_inside_a_json_string_belongs_to_the_arguments() {
    let raw = "<tool_call>\n{\"name\": \"query\", \"arguments\": {\"sql\": \"SELECT '</tool_call>' AS x\"}}\n</tool_call>";
    let p = parse_output(raw, None);
    assert_eq!(p.error, None, "{p:?}");
    assert_eq!(p.calls.len(), 1);
    assert_eq!(p.calls[0].arguments["sql"], "SELECT '</tool_call>' AS x");
    // Two calls, the first holding the tag in a string with escaped quotes.
    let raw = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"t\": \"x \\\"</tool_call>\\\" y\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
    let p = parse_output(raw, None);
    assert_eq!(p.error, None, "{p:?}");
    assert_eq!(
        p.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    // Malformed JSON still fails clearly (no guess).
    let p = parse_output(
        "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call>",
        None,
    );
    assert!(p.error.is_some());
}
