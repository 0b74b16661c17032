//! The CLI contract: outputs other tools parse, exit codes 0 / 2.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_policy-serve"))
}

fn fixture(p: &str) -> std::path::PathBuf {
    common::fixtures().join(p)
}

#[test]
fn models_json_lists_the_demo_first_with_all_fields() {
    let out = bin().args(["models", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["key"], "demo");
    assert_eq!(v.as_array().unwrap().len(), 5);
    assert_eq!(v[4]["key"], "qwen3-30b-a3b");
    for m in v.as_array().unwrap() {
        for k in ["key", "label", "source", "thinking", "available"] {
            assert!(m.get(k).is_some(), "{k} missing in {m}");
        }
    }
}

#[test]
fn render_prints_exactly_the_golden_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(fixture("chat_template/cases.json")).unwrap(),
    )
    .unwrap();
    for name in [
        "05_tool_call_object_args",
        "10_thinking_disabled",
        "14_no_generation_prompt",
    ] {
        let case = cases.iter().find(|c| c["name"] == name).unwrap();
        let msgs = tmp.path().join("m.json");
        std::fs::write(&msgs, case["messages"].to_string()).unwrap();
        let mut cmd = bin();
        cmd.arg("render")
            .arg("--model-dir")
            .arg(fixture("qwen3"))
            .arg("--messages")
            .arg(&msgs);
        if let Some(tools) = case.get("tools") {
            let t = tmp.path().join("t.json");
            std::fs::write(&t, tools.to_string()).unwrap();
            cmd.arg("--tools").arg(t);
        }
        if let Some(b) = case.get("enable_thinking").and_then(|b| b.as_bool()) {
            cmd.arg("--enable-thinking").arg(b.to_string());
        }
        if case.get("add_generation_prompt") == Some(&serde_json::Value::Bool(false)) {
            cmd.arg("--no-generation-prompt");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = std::fs::read_to_string(fixture(&format!("chat_template/{name}.txt"))).unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{name}");
    }
}

fn parse(stdin: &str, tools: bool) -> (i32, serde_json::Value) {
    let mut cmd = bin();
    cmd.arg("parse");
    if tools {
        cmd.arg("--tools")
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/tools.json"));
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap(),
        serde_json::from_slice(&out.stdout).unwrap(),
    )
}

#[test]
fn parse_prints_calls_content_and_error() {
    let (code, v) = parse(
        "Sure.\n<tool_call>\n{\"name\": \"query\", \"arguments\": {\"sql\": \"SELECT 1\"}}\n</tool_call>",
        true,
    );
    assert_eq!(code, 0);
    assert_eq!(
        v,
        serde_json::json!({"calls": [{"name": "query", "arguments": {"sql": "SELECT 1"}}], "content": "Sure.", "error": null})
    );
    let (_, v) = parse(
        "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>",
        true,
    );
    assert!(v["error"].as_str().unwrap().contains("unknown tool `nope`"));
}

#[test]
fn the_demo_episode_runs_to_the_answer_tool() {
    let out = bin()
        .args(["episode", "--task", "How many users?", "--tools"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/tools.json"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("step 1: {\"type\":\"call\",\"calls\":[{\"name\":\"query\""),
        "{text}"
    );
    assert!(
        text.contains("\"name\":\"answer\"") && text.contains("finishing tool"),
        "{text}"
    );
}

#[test]
fn bad_usage_and_bad_input_exit_2_with_the_reason_on_stderr() {
    let cases: Vec<Vec<&str>> = vec![
        vec!["no-such-command"],
        vec![
            "episode",
            "--model",
            "nope",
            "--task",
            "x",
            "--tools",
            "examples/data/tools.json",
        ],
        vec![
            "render",
            "--model-dir",
            "/nonexistent",
            "--messages",
            "/nonexistent.json",
        ],
        vec!["episode", "--task", "x", "--tools", "Cargo.toml"],
    ];
    for args in cases {
        let out = bin()
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn generate_and_logits_run_on_the_tiny_checkpoint() {
    let dir = common::shared_tiny_model();
    let out = bin()
        .arg("generate")
        .arg("--model-dir")
        .arg(&dir)
        .args([
            "--prompt",
            "Hello there",
            "--max-new-tokens",
            "4",
            "--device",
            "cpu",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("generated 4 tok"));

    let tmp = tempfile::tempdir().unwrap();
    let npy = tmp.path().join("l.npy");
    let out = bin()
        .arg("logits")
        .arg("--model-dir")
        .arg(&dir)
        .args(["--ids", "1,2,3", "--device", "cpu", "--out"])
        .arg(&npy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&npy).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.contains("'shape': (3, 151936)"), "{header}");
    assert_eq!((10 + hlen) % 64, 0);
    assert_eq!(bytes.len(), 10 + hlen + 3 * 151_936 * 4);
}

/// A copy of the tiny model with some `config.json` fields overwritten.
fn tiny_with_config(fields: serde_json::Value) -> std::path::PathBuf {
    let dir = common::tiny_model_copy();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    for (k, v) in fields.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn absurd_config_dimensions_exit_2_with_the_reason_and_allocate_nothing() {
    let cases = [
        (
            serde_json::json!({"num_hidden_layers": 1_000_000_000u64}),
            "num_hidden_layers",
        ),
        (
            serde_json::json!({"num_hidden_layers": 1u64 << 62}),
            "num_hidden_layers",
        ),
        (
            serde_json::json!({"num_attention_heads": 1u64 << 40}),
            "num_attention_heads",
        ),
        (
            serde_json::json!({"num_hidden_layers": 3}),
            "checkpoint holds layer tensors up to model.layers.1",
        ),
    ];
    let generate = |dir: &std::path::Path| {
        bin()
            .args(["generate", "--model-dir"])
            .arg(dir)
            .args(["--prompt", "hi", "--max-new-tokens", "1", "--device", "cpu"])
            .output()
            .unwrap()
    };
    for (fields, needle) in cases {
        let out = generate(&tiny_with_config(fields.clone()));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{fields}: {err}");
        assert!(err.contains(needle), "{fields}: {err}");
    }
    // A huge max_position_embeddings is served: the RoPE tables follow the served context.
    let out = generate(&tiny_with_config(
        serde_json::json!({"max_position_embeddings": 1_000_000_000u64}),
    ));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// Hardening round 2 (#4, #5): absurd sizes are refused before anything is allocated or run,
// with exit 2 and the flag named. Mutations that fail it: the KV budget not checked against
// the host (the process aborts on the allocation), or `prompt + max_new` unchecked (it wraps
// and the request generates).
#[test]
fn absurd_flags_exit_2_naming_the_flag_before_anything_runs() {
    let dir = common::shared_tiny_model();
    let cases: [(&[&str], &str); 2] = [
        (
            &["--kv-cache-gib", "100000", "--max-running", "100000000"],
            "--kv-cache-gib",
        ),
        (
            &["--max-new-tokens", "18446744073709551615"],
            "max_new_tokens",
        ),
    ];
    for (flags, needle) in cases {
        let t = std::time::Instant::now();
        let out = bin()
            .args(["generate", "--model-dir"])
            .arg(&dir)
            .args(["--prompt", "hi", "--device", "cpu"])
            .args(flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(needle), "{flags:?}: {err}");
        assert!(
            t.elapsed().as_secs() < 20,
            "{flags:?} ran for {:?}",
            t.elapsed()
        );
    }
}

// Hardening round 2 (#11): a layer index of usize::MAX does not wrap the layer count to 0.
#[test]
fn a_layer_index_of_usize_max_is_named_not_wrapped() {
    let dir = common::tiny_model_copy();
    let path = dir.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
    tensors.insert(
        format!("model.layers.{}.extra.weight", usize::MAX),
        candle_core::Tensor::zeros(2, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let out = bin()
        .args(["generate", "--model-dir"])
        .arg(&dir)
        .args(["--prompt", "hi", "--max-new-tokens", "1", "--device", "cpu"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("model.layers.{}", usize::MAX)),
        "{err}"
    );
    assert!(!err.contains("holds 0 layers"), "{err}");
    assert_eq!(err.matches("failed to load model").count(), 1, "{err}");
}

/// The f32 rows of a `.npy` file written by `logits`.
fn npy_rows(path: &std::path::Path, cols: usize) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + hlen..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect::<Vec<f32>>()
        .chunks(cols)
        .map(<[f32]>::to_vec)
        .collect()
}

/// `logits`, `generate` and `episode` take `--adapter DIR`: the logits are the engine's through
/// that adapter (not the base's); a directory without an adapter exits 2 naming the file.
#[test]
fn logits_generate_and_episode_run_through_an_adapter() {
    let dir = common::shared_tiny_model();
    let adapter = tempfile::tempdir().unwrap();
    let cfg: policy_serve::engine::ModelConfig =
        serde_json::from_value(common::tiny_config()).unwrap();
    policy_serve::testing::write_random_adapter(adapter.path(), &cfg, 4, 0.3).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let logits = |with: Option<&std::path::Path>, name: &str| {
        let npy = tmp.path().join(name);
        let mut cmd = bin();
        cmd.arg("logits").arg("--model-dir").arg(&dir);
        cmd.args(["--ids", "1,2,3,4", "--device", "cpu", "--out"])
            .arg(&npy);
        if let Some(a) = with {
            cmd.arg("--adapter").arg(a);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        npy_rows(&npy, 151_936)
    };
    let (base, through) = (logits(None, "b.npy"), logits(Some(adapter.path()), "a.npy"));
    let registry = policy_serve::ModelRegistry::new(vec![
        policy_serve::ModelSpec::local("t", "t", &dir),
        policy_serve::ModelSpec::adapter(
            "a",
            "a",
            "t",
            policy_serve::ModelSource::Local(adapter.path().to_path_buf()),
        ),
    ])
    .unwrap()
    .with_options(policy_serve::EngineOptions {
        device: policy_serve::engine::DeviceChoice::Cpu,
        ..Default::default()
    });
    let m = registry.model("a").unwrap();
    let want = m
        .engine()
        .logits_with(vec![1, 2, 3, 4], m.adapter().as_ref())
        .unwrap();
    let diff = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        a.iter()
            .flatten()
            .zip(b.iter().flatten())
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    assert!(diff(&through, &want) <= 1e-5, "{}", diff(&through, &want));
    assert!(
        diff(&through, &base) > 1e-2,
        "the adapter changes the logits"
    );
    let out = bin()
        .arg("generate")
        .arg("--model-dir")
        .arg(&dir)
        .arg("--adapter")
        .arg(adapter.path())
        .args([
            "--prompt",
            "Hello",
            "--max-new-tokens",
            "3",
            "--device",
            "cpu",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bin()
        .args([
            "episode",
            "--model",
            "qwen3-0.6b",
            "--task",
            "hi",
            "--max-steps",
            "1",
        ])
        .args(["--max-new-tokens", "4", "--device", "cpu", "--tools"])
        .arg(fixture("tools/nested.json"))
        .arg("--model-dir")
        .arg(&dir)
        .arg("--adapter")
        .arg(adapter.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"adapter\""),
        "the episode's costs name the adapter: {}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = bin()
        .arg("logits")
        .arg("--model-dir")
        .arg(&dir)
        .arg("--adapter")
        .arg(tmp.path())
        .args(["--ids", "1", "--device", "cpu", "--out"])
        .arg(tmp.path().join("x.npy"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("adapter_config.json"), "{stderr}");
}

#[test]
fn expert_parallel_is_a_flag_of_the_head_and_the_worker_and_a_dense_model_refuses_it() {
    for sub in ["episode", "worker", "generate"] {
        let out = bin().args([sub, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("--expert-parallel"), "{sub}: {help}");
    }
    // A dense checkpoint: a clear refusal (exit 2), not a crash.
    let out = bin()
        .args(["generate", "--model-dir"])
        .arg(common::shared_tiny_model())
        .args(["--prompt", "hi", "--device", "cpu", "--expert-parallel"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("needs a mixture-of-experts checkpoint"),
        "{err}"
    );
}
