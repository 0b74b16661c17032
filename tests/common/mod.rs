//! Test helpers: tiny random Qwen3 checkpoints in the real HF layout (config.json,
//! model.safetensors with HF tensor names, the real Qwen3 tokenizer files).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use policy_serve::testing::TensorRole;
use serde_json::{Value, json};

/// The repo's fixture directory.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A tiny Qwen3 config with the real vocabulary. Head counts divide by 4.
pub fn tiny_config() -> Value {
    json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "max_window_layers": 2,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "hidden_act": "silu",
        "sliding_window": null,
        "use_sliding_window": false,
        "torch_dtype": "float32",
        "bos_token_id": 151643,
        "eos_token_id": 151645
    })
}

struct Gauss(u64);

impl Gauss {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn tensor(&mut self, shape: (usize, usize), mean: f64, std: f64) -> Tensor {
        let v: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| {
                let (u1, u2) = (self.uniform(), self.uniform());
                (mean + (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * std) as f32
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }
    fn norm(&mut self, n: usize) -> Tensor {
        self.tensor((1, n), 1.0, 0.1).squeeze(0).unwrap()
    }
}

/// The tensors of a Qwen3 checkpoint for `cfg`, random with a fixed seed: embedding N(0, 1),
/// projections N(0, 1/fan_in), norms N(1, 0.1).
pub fn random_tensors(cfg: &Value, seed: u64) -> HashMap<String, Tensor> {
    let mut r = Gauss(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mcfg: policy_serve::engine::ModelConfig =
        serde_json::from_value(cfg.clone()).expect("a Qwen3 config");
    policy_serve::testing::qwen3_tensor_specs(&mcfg)
        .into_iter()
        .map(|t| {
            let tensor = match t.role {
                TensorRole::Embedding => r.tensor((t.shape[0], t.shape[1]), 0.0, 1.0),
                TensorRole::Matrix => r.tensor(
                    (t.shape[0], t.shape[1]),
                    0.0,
                    1.0 / (t.shape[1] as f64).sqrt(),
                ),
                TensorRole::Norm => r.norm(t.shape[0]),
            };
            (t.name, tensor)
        })
        .collect()
}

/// A deterministic synthetic prompt (see `policy_serve::testing::synthetic_prompt`).
pub fn prompt(n: usize, salt: u32) -> Vec<u32> {
    policy_serve::testing::synthetic_prompt(n, salt as usize)
}

/// Writes a tiny random Qwen3 model directory: config.json, model.safetensors, the Qwen3
/// tokenizer files and generation_config.json.
pub fn write_tiny_model(dir: &Path, seed: u64) -> PathBuf {
    write_model(dir, &tiny_config(), seed)
}

/// Writes a model directory for `cfg`.
pub fn write_model(dir: &Path, cfg: &Value, seed: u64) -> PathBuf {
    write_model_with(dir, cfg, seed, |_| {})
}

/// Writes a model directory for `cfg` whose tensors `edit` changed (or added to) first.
pub fn write_model_with(
    dir: &Path,
    cfg: &Value,
    seed: u64,
    edit: impl FnOnce(&mut HashMap<String, Tensor>),
) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(cfg).unwrap(),
    )
    .unwrap();
    let mut tensors = random_tensors(cfg, seed);
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(fixtures().join("qwen3").join(f), dir.join(f)).unwrap();
    }
    dir.to_path_buf()
}

/// A shared tiny model directory: written once (atomically, by rename) under the temp dir
/// and reused by every test binary and run; its name carries the layout version and seed.
pub fn shared_tiny_model() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| cached_model("tiny-v1-seed42", &tiny_config(), 42))
        .clone()
}

/// A registry offering the shared tiny model under the key `tiny`, with `opts`.
pub fn tiny_registry(opts: policy_serve::EngineOptions) -> policy_serve::ModelRegistry {
    policy_serve::ModelRegistry::new(vec![policy_serve::ModelSpec::local(
        "tiny",
        "Tiny",
        shared_tiny_model(),
    )])
    .unwrap()
    .with_options(opts)
}

/// A model directory for `cfg` and `seed`, written once under the temp dir as `name`.
pub fn cached_model(name: &str, cfg: &Value, seed: u64) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("policy-serve-{name}"));
    if dir.join("model.safetensors").is_file() {
        return dir;
    }
    // Unique per process and per call: two threads of one test binary may write at once.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let staging = std::env::temp_dir().join(format!(
        "policy-serve-{name}.{}.{call}.tmp",
        std::process::id()
    ));
    write_model(&staging, cfg, seed);
    if std::fs::rename(&staging, &dir).is_err() {
        // Another process got there first; theirs is identical.
        let _ = std::fs::remove_dir_all(&staging);
    }
    dir
}

/// A private copy of the shared tiny model (to break or change one of its files).
pub fn tiny_model_copy() -> PathBuf {
    let src = shared_tiny_model();
    let dir = tempfile::tempdir().unwrap().keep();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    dir
}

/// Worker threads of an in-process group.
pub type Workers =
    Vec<std::thread::JoinHandle<policy_serve::Result<policy_serve::engine::WorkerReport>>>;

/// An in-process group of `world` ranks: the head's link (rank 0) and ranks 1.. running
/// `run_worker` on threads over the model in `dir`, each with `worker(rank)`'s options.
pub fn in_process_group(
    dir: &Path,
    world: usize,
    worker: impl Fn(usize) -> policy_serve::engine::WorkerOptions,
) -> (std::sync::Arc<policy_serve::engine::InProcessComm>, Workers) {
    use policy_serve::engine::{CommBackend, InProcessComm, run_worker};
    let mut comms: Vec<std::sync::Arc<InProcessComm>> =
        InProcessComm::group(world, std::time::Duration::from_secs(5))
            .into_iter()
            .map(std::sync::Arc::new)
            .collect();
    let head = comms.remove(0);
    let files = policy_serve::registry::resolve_files(
        "group",
        &policy_serve::ModelSource::Local(dir.to_path_buf()),
    )
    .unwrap();
    let workers = comms
        .into_iter()
        .map(|c| {
            let files = files.clone();
            let o = worker(c.rank());
            std::thread::spawn(move || run_worker(&files, &o, c))
        })
        .collect();
    (head, workers)
}
