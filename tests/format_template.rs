//! Chat-template parity: our minijinja rendering of the real Qwen3 template equals the output
//! of HF `transformers` `apply_chat_template(..., tokenize=False)` byte for byte. The goldens
//! and the script that made them: tests/fixtures/chat_template/, scripts/make_template_goldens.py.

use std::path::PathBuf;

use policy_serve::policy::format::{ChatTemplate, Message, RenderOptions, ToolDefinition};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn qwen3_template() -> ChatTemplate {
    ChatTemplate::from_model_dir(&fixtures().join("qwen3")).expect("the Qwen3 template compiles")
}

#[test]
fn every_golden_conversation_renders_byte_identical_to_transformers() {
    let template = qwen3_template();
    let cases: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("chat_template/cases.json")).unwrap(),
    )
    .unwrap();
    assert!(cases.len() >= 15, "at least 15 golden conversations");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let tools: Option<Vec<ToolDefinition>> = case
            .get("tools")
            .map(|t| serde_json::from_value(t.clone()).unwrap());
        let opts = RenderOptions {
            add_generation_prompt: case
                .get("add_generation_prompt")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            enable_thinking: case.get("enable_thinking").and_then(Value::as_bool),
        };
        let got = template.render(&messages, tools.as_deref(), opts).unwrap();
        let want =
            std::fs::read_to_string(fixtures().join(format!("chat_template/{name}.txt"))).unwrap();
        if got != want {
            let at = got
                .bytes()
                .zip(want.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            failures.push(format!(
                "{name}: first difference at byte {at}\n  ours: {:?}\n  hf:   {:?}",
                &got[at.saturating_sub(20).min(got.len())..(at + 40).min(got.len())],
                &want[at.saturating_sub(20).min(want.len())..(at + 40).min(want.len())]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_changed_message_changes_the_render_positive_control() {
    let template = qwen3_template();
    let a = template
        .render(&[Message::user("Hi")], None, RenderOptions::default())
        .unwrap();
    let b = template
        .render(&[Message::user("Hi!")], None, RenderOptions::default())
        .unwrap();
    assert_ne!(a, b);
    assert_eq!(a, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

#[test]
fn raise_exception_in_a_template_is_an_error_not_a_panic() {
    let t = ChatTemplate::new(
        "{{ raise_exception('only user and assistant roles are supported') }}",
        Default::default(),
    )
    .unwrap();
    let err = t
        .render(&[Message::user("x")], None, RenderOptions::default())
        .unwrap_err();
    assert!(
        err.to_string().contains("only user and assistant roles"),
        "{err}"
    );
}

#[test]
fn tojson_follows_python_json_dumps() {
    let t = ChatTemplate::new(
        "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}",
        Default::default(),
    )
    .unwrap();
    let got = t
        .render(
            &[Message::user("é <b> \"q\"\n")],
            None,
            RenderOptions {
                add_generation_prompt: false,
                enable_thinking: None,
            },
        )
        .unwrap();
    assert_eq!(
        got,
        "{\"role\": \"user\", \"content\": \"é <b> \\\"q\\\"\\n\"}|{\n  \"role\": \"user\",\n  \"content\": \"é <b> \\\"q\\\"\\n\"\n}"
    );
}

#[test]
fn an_empty_conversation_and_a_broken_template_are_errors() {
    let template = qwen3_template();
    assert!(
        template
            .render(&[], None, RenderOptions::default())
            .is_err()
    );
    assert!(ChatTemplate::new("{% for x in %}", Default::default()).is_err());
}
