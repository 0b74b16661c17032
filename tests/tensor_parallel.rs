//! Tensor-parallel Qwen3 over the in-process backend (threads): world sizes 1, 2, 4 agree with
//! one rank; a failed command fails one request only; links and shutdown end the workers.

mod common;

use common::prompt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use policy_serve::engine::{
    CommHandle, DeviceChoice, InProcessComm, WorkerCommand, WorkerOptions, WorkerReport,
};
use policy_serve::{EngineOptions, Error, GenerationRequest, ModelRegistry, ModelSpec};

/// A tiny config whose head counts and MLP size divide by 4.
fn tp_model() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let mut cfg = common::tiny_config();
        cfg["num_attention_heads"] = 8.into();
        cfg["num_key_value_heads"] = 4.into();
        cfg["head_dim"] = 8.into();
        common::cached_model("tp-v1-seed7", &cfg, 7)
    })
    .clone()
}

fn options() -> EngineOptions {
    EngineOptions {
        device: DeviceChoice::Cpu,
        worker_timeout: Duration::from_secs(20),
        ..EngineOptions::default()
    }
}

struct Group {
    registry: ModelRegistry,
    head: Arc<InProcessComm>,
    workers: Vec<std::thread::JoinHandle<policy_serve::Result<WorkerReport>>>,
}

fn group(world: usize, worker_opts: impl Fn(usize) -> WorkerOptions) -> Group {
    group_with(world, options(), worker_opts)
}

/// A group whose head runs with `head` (its tensor-parallel link added).
fn group_with(
    world: usize,
    head_opts: EngineOptions,
    worker_opts: impl Fn(usize) -> WorkerOptions,
) -> Group {
    let dir = tp_model();
    let (head, workers) = common::in_process_group(&dir, world, worker_opts);
    let opts = EngineOptions {
        tensor_parallel: Some(CommHandle(head.clone())),
        ..head_opts
    };
    let registry = ModelRegistry::new(vec![ModelSpec::local("tp", "TP", &dir)])
        .unwrap()
        .with_options(opts);
    Group {
        registry,
        head,
        workers,
    }
}

fn plain_worker(_: usize) -> WorkerOptions {
    WorkerOptions {
        engine: options(),
        fail_command: None,
    }
}

fn run_all(registry: &ModelRegistry) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    let engine = registry.model("tp").unwrap().engine().clone();
    let logits = engine.logits(prompt(21, 1)).unwrap();
    let pending: Vec<_> = (0..4)
        .map(|i| {
            engine
                .submit(GenerationRequest::new(prompt(5 + 7 * i, 2 + i as u32)).max_new_tokens(10))
        })
        .collect();
    let mut tokens: Vec<Vec<u32>> = pending
        .into_iter()
        .map(|p| p.wait().unwrap().tokens)
        .collect();
    // A request sharing a 32-token prefix with an earlier one reuses its cached blocks: the
    // head's block tables travel with each step, so every rank reads the same slots.
    let mut shared = prompt(5 + 7 * 3, 5)[..].to_vec();
    shared.extend(prompt(40, 9));
    let g = engine
        .generate(GenerationRequest::new(shared).max_new_tokens(10))
        .unwrap();
    assert!(
        g.cached_prompt_tokens >= 16,
        "the shared prefix came from the cache: {g:?}"
    );
    tokens.push(g.tokens);
    (logits, tokens)
}

#[test]
fn world_sizes_1_2_and_4_give_the_same_logits_and_greedy_tokens() {
    let one = ModelRegistry::new(vec![ModelSpec::local("tp", "TP", tp_model())])
        .unwrap()
        .with_options(options());
    let (ref_logits, ref_tokens) = run_all(&one);
    for world in [1, 2, 4] {
        let g = group(world, plain_worker);
        let (logits, tokens) = run_all(&g.registry);
        assert_eq!(tokens, ref_tokens, "world {world}");
        let mut worst = 0f32;
        for (a, b) in logits.iter().zip(&ref_logits) {
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (x, y) in a.iter().zip(b) {
                worst = worst.max((x - y).abs() / scale);
            }
        }
        assert!(
            worst <= 1e-4,
            "world {world}: relative logits error {worst}"
        );
        drop(g.registry);
        for w in g.workers {
            let report = w.join().unwrap().unwrap();
            assert!(report.clean_shutdown, "head shutdown stops every worker");
            assert!(report.commands > 0);
        }
    }
}

#[test]
fn a_command_that_fails_on_one_worker_fails_that_request_only() {
    const POISON: u32 = 149_999;
    let g = group(2, |_| WorkerOptions {
        engine: options(),
        fail_command: Some(Arc::new(
            |c: &WorkerCommand| matches!(c, WorkerCommand::Forward { tokens, .. } if tokens.contains(&POISON)),
        )),
    });
    let engine = g.registry.model("tp").unwrap().engine().clone();
    let mut bad = prompt(12, 3);
    bad[5] = POISON;
    let good = engine.submit(GenerationRequest::new(prompt(9, 4)).max_new_tokens(6));
    let err = engine
        .generate(GenerationRequest::new(bad).max_new_tokens(6))
        .unwrap_err();
    assert!(
        matches!(err, Error::Engine(_)) && err.to_string().contains("injected failure"),
        "{err}"
    );
    assert_eq!(
        good.wait().unwrap().generated_tokens,
        6,
        "the other request is unaffected"
    );
    assert_eq!(
        engine
            .generate(GenerationRequest::new(prompt(7, 5)).max_new_tokens(4))
            .unwrap()
            .generated_tokens,
        4,
        "the next request succeeds"
    );
    drop(engine);
    drop(g.registry);
    for w in g.workers {
        let r = w.join().unwrap().unwrap();
        assert!(r.failed >= 1 && r.clean_shutdown, "{r:?}");
    }
}

#[test]
fn a_closed_link_ends_the_worker_loop_within_a_bounded_time() {
    let g = group(2, plain_worker);
    let engine = g.registry.model("tp").unwrap().engine().clone();
    assert_eq!(
        engine
            .generate(GenerationRequest::new(prompt(6, 6)).max_new_tokens(3))
            .unwrap()
            .generated_tokens,
        3
    );
    let t = Instant::now();
    g.head.close_links();
    for w in g.workers {
        let r = w.join().unwrap().unwrap();
        assert!(
            !r.clean_shutdown,
            "the loop ended because the link went away"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(10));
    // The head now fails requests with a clear error instead of hanging.
    let err = engine
        .generate(GenerationRequest::new(prompt(6, 7)).max_new_tokens(3))
        .unwrap_err();
    assert!(err.to_string().contains("closed"), "{err}");
}

#[test]
fn a_dead_worker_makes_the_head_fail_requests_instead_of_hanging() {
    const CRASH: u32 = 149_998;
    let g = group(2, |_| WorkerOptions {
        engine: options(),
        // Simulates a worker process dying mid-run: its thread unwinds and drops its links.
        fail_command: Some(Arc::new(|c: &WorkerCommand| {
            if matches!(c, WorkerCommand::Forward { tokens, .. } if tokens.contains(&CRASH)) {
                panic!("simulated worker crash");
            }
            false
        })),
    });
    let engine = g.registry.model("tp").unwrap().engine().clone();
    assert_eq!(
        engine
            .generate(GenerationRequest::new(prompt(6, 8)).max_new_tokens(3))
            .unwrap()
            .generated_tokens,
        3
    );
    let t = Instant::now();
    let mut crash = prompt(6, 9);
    crash[2] = CRASH;
    let err = engine
        .generate(GenerationRequest::new(crash).max_new_tokens(3))
        .unwrap_err();
    assert!(err.to_string().contains("worker rank 1"), "{err}");
    let err = engine
        .generate(GenerationRequest::new(prompt(6, 10)).max_new_tokens(3))
        .unwrap_err();
    assert!(err.to_string().contains("worker rank 1"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "failed fast, no hang"
    );
    for w in g.workers {
        assert!(w.join().is_err(), "the worker thread crashed");
    }
}

#[test]
fn world_sizes_that_do_not_divide_the_heads_are_refused_clearly() {
    let comms: Vec<Arc<InProcessComm>> = InProcessComm::group(3, Duration::from_secs(2))
        .into_iter()
        .map(Arc::new)
        .collect();
    let opts = EngineOptions {
        tensor_parallel: Some(CommHandle(comms[0].clone())),
        ..options()
    };
    let r = ModelRegistry::new(vec![ModelSpec::local("tp", "TP", tp_model())])
        .unwrap()
        .with_options(opts);
    let err = r.model("tp").unwrap_err().to_string();
    assert!(
        err.contains("world size 3 does not divide") && err.contains("num_attention_heads = 8"),
        "{err}"
    );
}

#[test]
fn a_worker_with_other_settings_refuses_to_start_and_names_the_flag() {
    let g = group(2, |_| WorkerOptions {
        engine: EngineOptions {
            block_size: 32,
            ..options()
        },
        fail_command: None,
    });
    let err = g.registry.model("tp").unwrap_err().to_string();
    assert!(
        err.contains("refused to start") && err.contains("--block-size 16"),
        "{err}"
    );
    for w in g.workers {
        assert!(w.join().unwrap().is_err());
    }
}

/// `EngineOptions::tp_graphs` on the CPU: the engine serves as without it, and a worker told to
/// capture CUDA graphs (`WorkerCommand::CaptureGraphs`, what a CUDA head sends) refuses in its
/// ack, meets the head in the agreement that follows (so both stay eager), and keeps serving.
/// Fails if the worker skips that agreement (the head's collective times out), leaves its loop
/// on the refusal (the next request fails), or claims a replayed step.
#[test]
fn a_worker_that_cannot_capture_graphs_says_so_and_keeps_serving() {
    let head_opts = EngineOptions {
        tp_graphs: true,
        ..options()
    };
    let g = group_with(2, head_opts, plain_worker);
    let engine = g.registry.model("tp").unwrap().engine().clone();
    let tokens = |salt| {
        engine
            .generate(GenerationRequest::new(prompt(9, salt)).max_new_tokens(5))
            .unwrap()
            .tokens
    };
    let before = tokens(11);
    let cmd = WorkerCommand::CaptureGraphs {
        max_running: 8,
        max_graph_batch: 8,
        max_context: 256,
        graph_pdl: true,
    };
    let acks = policy_serve::engine::CommBackend::send_command(
        g.head.as_ref(),
        &cmd,
        Duration::from_secs(20),
    )
    .unwrap();
    let refusal = acks[0].clone().unwrap_err();
    assert!(refusal.to_lowercase().contains("cuda"), "{refusal}");
    let all_ok = policy_serve::engine::agree(g.head.as_ref(), true, &candle_core::Device::Cpu);
    assert!(!all_ok.unwrap(), "the worker's refusal reaches every rank");
    assert_eq!(tokens(11), before, "the group serves as before");
    drop(engine);
    drop(g.registry);
    for w in g.workers {
        let r = w.join().unwrap().unwrap();
        assert!(
            r.clean_shutdown && r.commands > 0 && r.replayed == 0,
            "{r:?}"
        );
    }
}

/// `CommBackend::all_reduce_sum_in_place` (what a graph's all-reduces use): every rank's own
/// buffer, a row view into a larger tensor as a graph's activations are, ends with the sum,
/// and nothing outside the view changes. Fails if the sum lands in a new tensor only, or at
/// the buffer's start instead of the view's.
#[test]
fn the_in_place_all_reduce_sums_into_each_ranks_own_view() {
    use policy_serve::engine::CommBackend;
    let comms = InProcessComm::group(3, Duration::from_secs(5));
    let threads: Vec<_> = comms
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let r = c.rank() as f32;
                let whole = candle_core::Tensor::new(
                    &[[r, r], [r + 1.0, 10.0 * (r + 1.0)]],
                    &candle_core::Device::Cpu,
                )
                .unwrap();
                let view = whole.narrow(0, 1, 1).unwrap();
                c.all_reduce_sum_in_place(&view).unwrap();
                whole.to_vec2::<f32>().unwrap()
            })
        })
        .collect();
    for (r, t) in threads.into_iter().enumerate() {
        let r = r as f32;
        assert_eq!(t.join().unwrap(), vec![vec![r, r], vec![6.0, 60.0]]);
    }
}

/// The same config as [`tp_model`] with other weights (seed 8).
fn tp_model_b() -> std::path::PathBuf {
    let mut cfg = common::tiny_config();
    cfg["num_attention_heads"] = 8.into();
    cfg["num_key_value_heads"] = 4.into();
    cfg["head_dim"] = 8.into();
    common::cached_model("tp-v1-seed8", &cfg, 8)
}

/// A weight update of a tensor-parallel engine: every rank checks the directory, then writes
/// its shard; the group then answers as one rank loaded from the new files. A broken
/// checkpoint leaves every rank as it was; tensors in host memory are refused with the way
/// out. Mutation that fails it: the head writing its shard without telling the workers.
#[test]
fn a_tensor_parallel_engine_updates_every_rank() {
    use policy_serve::engine::{HostTensor, WeightSource};
    let one_b = ModelRegistry::new(vec![ModelSpec::local("tp", "TP", tp_model_b())])
        .unwrap()
        .with_options(options());
    let (ref_logits, ref_tokens) = run_all(&one_b);
    let g = group(2, plain_worker);
    let engine = g.registry.model("tp").unwrap().engine().clone();
    let before = engine.logits(prompt(21, 1)).unwrap();
    let broken = tempfile::tempdir().unwrap();
    std::fs::copy(
        tp_model_b().join("config.json"),
        broken.path().join("config.json"),
    )
    .unwrap();
    std::fs::write(broken.path().join("model.safetensors"), b"junk").unwrap();
    let e = g
        .registry
        .update_weights("tp", WeightSource::Dir(broken.path().into()), true)
        .unwrap_err();
    assert!(matches!(e, Error::WeightUpdate(_)), "{e}");
    let e = engine
        .update_weights(
            WeightSource::Host(vec![HostTensor {
                name: "model.norm.weight".into(),
                dtype: candle_core::DType::F32,
                shape: vec![32],
                bytes: vec![0; 128],
            }]),
            true,
        )
        .wait()
        .unwrap_err();
    assert!(e.to_string().contains("checkpoint directory"), "{e}");
    assert_eq!(
        engine.logits(prompt(21, 1)).unwrap(),
        before,
        "refusals changed nothing"
    );
    let v = g
        .registry
        .update_weights("tp", WeightSource::Dir(tp_model_b()), true)
        .unwrap();
    assert_eq!(v.version, 1);
    let (logits, tokens) = run_all(&g.registry);
    assert_eq!(tokens, ref_tokens);
    let mut worst = 0f32;
    for (a, b) in logits.iter().zip(&ref_logits) {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    assert!(worst <= 1e-4, "relative logits error {worst}");
    drop(engine);
    drop(g.registry);
    for w in g.workers {
        assert!(w.join().unwrap().unwrap().clean_shutdown);
    }
}

#[test]
fn fp8_kv_runs_on_every_rank_with_its_own_calibrated_scales() {
    use policy_serve::engine::KvCacheDtype;
    // Chunks of 8: the later chunks attend over an fp8 prefix read back from every rank.
    let fp8 = EngineOptions {
        kv_dtype: KvCacheDtype::Fp8,
        prefill_chunk: 8,
        ..options()
    };
    let tokens = prompt(40, 3);
    let single = |opts: EngineOptions| {
        let r = ModelRegistry::new(vec![ModelSpec::local("tp", "TP", tp_model())])
            .unwrap()
            .with_options(opts);
        r.model("tp")
            .unwrap()
            .engine()
            .logits(tokens.clone())
            .unwrap()
    };
    let exact = single(options());
    let one_rank_fp8 = single(fp8.clone());
    let rel = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        let mut worst = 0f32;
        for (x, y) in a.iter().zip(b) {
            let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (p, q) in x.iter().zip(y) {
                worst = worst.max((p - q).abs() / scale);
            }
        }
        worst
    };
    let worker = |_: usize| WorkerOptions {
        engine: fp8.clone(),
        fail_command: None,
    };
    let g = group_with(2, fp8.clone(), worker);
    let engine = g.registry.model("tp").unwrap().engine().clone();
    assert_eq!(engine.info().kv_dtype, candle_core::DType::F8E4M3);
    let tp = engine.logits(tokens.clone()).unwrap();
    // Each rank rounds its own heads' K/V with its own scales: fp8's error, not more (a rank
    // reading its cache without its scales, or with the other rank's, is far off).
    let (err, err_one) = (rel(&tp, &exact), rel(&one_rank_fp8, &exact));
    assert!(err <= 5e-2, "2 ranks, fp8 KV: relative error {err}");
    assert!(err > 1e-5, "fp8 rounding shows ({err}): is the cache fp8?");
    assert!(
        err <= 2.0 * err_one + 1e-3,
        "2 ranks {err} vs one rank {err_one}"
    );
    drop(engine);
    drop(g.registry);
    for w in g.workers {
        assert!(w.join().unwrap().unwrap().clean_shutdown);
    }
    // A worker not told to store fp8 refuses the head's Hello, naming the flag.
    let plain = |_: usize| WorkerOptions {
        engine: options(),
        fail_command: None,
    };
    let g = group_with(2, fp8, plain);
    let Err(err) = g.registry.model("tp") else {
        panic!("the ranks disagree on the KV dtype")
    };
    let err = err.to_string();
    assert!(err.contains("--kv-cache-dtype"), "{err}");
}
