//! Policies through the registry, as a host uses them: the demo, and a full episode of a
//! model policy on the tiny Qwen3 checkpoint whose prompts equal the template's rendering.

mod common;

use policy_serve::engine::DeviceChoice;
use policy_serve::policy::format::{ChatTemplate, Message, RenderOptions, parse_output};
use policy_serve::{
    Action, DemoPolicy, EngineOptions, EpisodeConfig, ModelPolicy, ModelRegistry, ModelSpec,
    Observation, Policy, ToolCall, ToolDefinition,
};

fn tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition::new("list_tables", "List tables"),
        ToolDefinition::new("query", "Run SQL")
            .param("sql", "string", "SQL", true)
            .param("limit", "integer", "rows", false),
        ToolDefinition::new("submit_answer", "Submit").param("value", "string", "answer", true),
    ]
}

#[test]
fn the_demo_calls_each_tool_once_with_valid_arguments_then_the_finishing_tool_then_replies() {
    let r = ModelRegistry::with_defaults();
    let mut p = r
        .get_policy("demo", EpisodeConfig::with_tools(tools()).system("sys"))
        .unwrap();
    let mut names = Vec::new();
    let mut obs: Observation = "task".into();
    for _ in 0..4 {
        let step = p.act(obs).unwrap();
        // The raw text parses back to the same action, validated against the tools.
        assert_eq!(
            parse_output(&step.raw, Some(&tools())).into_action(&step.raw),
            step.action
        );
        match &step.action {
            Action::Call { calls, .. } => names.push(calls[0].name.clone()),
            Action::Reply { .. } => names.push("<reply>".into()),
            Action::Invalid { error, .. } => panic!("demo produced invalid output: {error}"),
        }
        obs = "ok".into();
    }
    assert_eq!(names, ["list_tables", "query", "submit_answer", "<reply>"]);
    let t = p.transcript();
    assert_eq!(t[0].role, "system");
    assert_eq!(t.iter().filter(|m| m.role == "tool").count(), 3);
}

#[test]
fn a_scripted_demo_plays_its_script_deterministically() {
    let call = Action::Call {
        calls: vec![ToolCall {
            name: "query".into(),
            arguments: serde_json::json!({"sql": "x"}).as_object().unwrap().clone(),
        }],
        content: String::new(),
    };
    let run = || {
        let mut p = DemoPolicy::new("demo", &EpisodeConfig::with_tools(tools())).with_script(vec![
            call.clone(),
            Action::Reply {
                content: "42".into(),
            },
        ]);
        (0..3)
            .map(|_| p.act("o".into()).unwrap().action)
            .collect::<Vec<_>>()
    };
    let a = run();
    assert_eq!(a, run());
    assert_eq!(a[0], call);
    assert_eq!(
        a[1],
        Action::Reply {
            content: "42".into()
        }
    );
    assert_eq!(
        a[2],
        Action::Reply {
            content: "script finished".into()
        }
    );
}

#[test]
fn a_model_policy_runs_a_full_episode_and_its_prompts_equal_the_template() {
    let dir = common::shared_tiny_model();
    let r = ModelRegistry::new(vec![ModelSpec::local("tiny", "Tiny", &dir)])
        .unwrap()
        .with_options(EngineOptions {
            device: DeviceChoice::Cpu,
            ..EngineOptions::default()
        });
    let episode = EpisodeConfig {
        max_new_tokens: Some(12),
        temperature: Some(0.0),
        ..EpisodeConfig::with_tools(tools()).system("You are a SQL agent.")
    };
    let model = r.model("tiny").unwrap();
    let mut policy = ModelPolicy::new(model.clone(), episode.clone()).unwrap();
    let template = ChatTemplate::from_model_dir(&dir).unwrap();
    let opts = RenderOptions {
        add_generation_prompt: true,
        enable_thinking: Some(false),
    };
    let mut expected: Vec<Message> = vec![
        Message::system("You are a SQL agent."),
        Message::user("How many users?"),
    ];
    let mut obs: Observation = "How many users?".into();
    for turn in 0..3 {
        let step = policy.act(obs).unwrap();
        let want = template.render(&expected, Some(&tools()), opts).unwrap();
        assert_eq!(policy.last_prompt().unwrap(), want, "turn {turn}");
        assert_eq!(
            step.cost.prompt_tokens,
            model.engine().tokenize(&want).unwrap().len()
        );
        assert!(step.cost.generated_tokens >= 1 && step.cost.generated_tokens <= 12);
        // Random weights: whatever came out, the action is what the parser says of the raw text.
        assert_eq!(
            step.action,
            parse_output(&step.raw, Some(&tools())).into_action(&step.raw)
        );
        expected.push(match &step.action {
            Action::Call { calls, content } => Message::assistant_with_calls(
                content.clone(),
                calls.iter().map(ToolCall::to_message_call).collect(),
            ),
            Action::Reply { content } => Message::assistant(content.clone()),
            Action::Invalid { raw, .. } => Message::assistant(raw.clone()),
        });
        let next = format!("result {turn}");
        expected.push(if matches!(step.action, Action::Call { .. }) {
            Message::tool(next.clone())
        } else {
            Message::user(next.clone())
        });
        obs = next.into();
    }
    assert_eq!(policy.transcript().len(), 1 + 3 * 2);
    // Greedy and fresh: a second policy on the same model replays the same first step.
    let mut again = r.get_policy("tiny", episode).unwrap();
    let mut first = ModelPolicy::new(
        model,
        EpisodeConfig {
            max_new_tokens: Some(12),
            temperature: Some(0.0),
            ..EpisodeConfig::with_tools(tools()).system("You are a SQL agent.")
        },
    )
    .unwrap();
    assert_eq!(
        again.act("How many users?".into()).unwrap().raw,
        first.act("How many users?".into()).unwrap().raw
    );
}

/// One shared tiny-model registry for the transaction tests.
fn tiny_registry() -> &'static ModelRegistry {
    static R: std::sync::OnceLock<ModelRegistry> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        let dir = common::shared_tiny_model();
        ModelRegistry::new(vec![ModelSpec::local("tiny", "Tiny", &dir)])
            .unwrap()
            .with_options(EngineOptions {
                device: DeviceChoice::Cpu,
                ..EngineOptions::default()
            })
    })
}

fn capped_episode() -> EpisodeConfig {
    EpisodeConfig {
        max_new_tokens: Some(3),
        temperature: Some(0.0),
        max_transcript_tokens: Some(600),
        ..EpisodeConfig::with_tools(tools()).system("You are a SQL agent.")
    }
}

#[test]
fn a_failed_act_leaves_the_transcript_as_it_was_and_the_episode_usable() {
    let mut p = tiny_registry()
        .get_policy("tiny", capped_episode())
        .unwrap();
    p.act("How many users?".into()).unwrap();
    let before = p.transcript().to_vec();
    let huge = "word ".repeat(2000);
    let err = p.act(huge.as_str().into()).unwrap_err();
    assert!(err.to_string().contains("max_transcript_tokens"), "{err}");
    assert_eq!(
        p.transcript(),
        before.as_slice(),
        "the failed act left no trace"
    );
    // The episode goes on.
    p.act("Count them again.".into()).unwrap();
    assert_eq!(p.transcript().len(), before.len() + 2);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 6, ..Default::default() })]

    /// Random sequences of valid and invalid (over the cap) acts give the transcript of the
    /// valid acts alone.
    #[test]
    fn invalid_acts_never_change_the_transcript(acts in proptest::collection::vec(proptest::bool::ANY, 1..5)) {
        let r = tiny_registry();
        let mut p = r.get_policy("tiny", capped_episode()).unwrap();
        let mut reference = r.get_policy("tiny", capped_episode()).unwrap();
        let huge = "word ".repeat(2000);
        for (i, valid) in acts.iter().enumerate() {
            if *valid {
                let obs = format!("observation {i}");
                let a = p.act(obs.as_str().into()).unwrap();
                let b = reference.act(obs.as_str().into()).unwrap();
                proptest::prop_assert_eq!(a.raw, b.raw);
            } else {
                proptest::prop_assert!(p.act(huge.as_str().into()).is_err());
            }
            proptest::prop_assert_eq!(p.transcript(), reference.transcript());
        }
    }
}
