//! Test helpers: tiny random Qwen3 checkpoints in the real HF layout (config.json,
//! model.safetensors with HF tensor names, the real Qwen3 tokenizer files).

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
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

/// The tensors of a Qwen3 checkpoint for `cfg`, random with a fixed seed.
pub fn random_tensors(cfg: &Value, seed: u64) -> HashMap<String, Tensor> {
    let mut r = Gauss(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let g = |k: &str| cfg[k].as_u64().unwrap() as usize;
    let (v, h, i, l) = (
        g("vocab_size"),
        g("hidden_size"),
        g("intermediate_size"),
        g("num_hidden_layers"),
    );
    let (nh, nkv, hd) = (
        g("num_attention_heads"),
        g("num_key_value_heads"),
        g("head_dim"),
    );
    let mut t = HashMap::new();
    t.insert(
        "model.embed_tokens.weight".into(),
        r.tensor((v, h), 0.0, 1.0),
    );
    for li in 0..l {
        let p = format!("model.layers.{li}");
        let s = 1.0 / (h as f64).sqrt();
        t.insert(
            format!("{p}.self_attn.q_proj.weight"),
            r.tensor((nh * hd, h), 0.0, s),
        );
        t.insert(
            format!("{p}.self_attn.k_proj.weight"),
            r.tensor((nkv * hd, h), 0.0, s),
        );
        t.insert(
            format!("{p}.self_attn.v_proj.weight"),
            r.tensor((nkv * hd, h), 0.0, s),
        );
        t.insert(
            format!("{p}.self_attn.o_proj.weight"),
            r.tensor((h, nh * hd), 0.0, 1.0 / ((nh * hd) as f64).sqrt()),
        );
        t.insert(format!("{p}.self_attn.q_norm.weight"), r.norm(hd));
        t.insert(format!("{p}.self_attn.k_norm.weight"), r.norm(hd));
        t.insert(
            format!("{p}.mlp.gate_proj.weight"),
            r.tensor((i, h), 0.0, s),
        );
        t.insert(format!("{p}.mlp.up_proj.weight"), r.tensor((i, h), 0.0, s));
        t.insert(
            format!("{p}.mlp.down_proj.weight"),
            r.tensor((h, i), 0.0, 1.0 / (i as f64).sqrt()),
        );
        t.insert(format!("{p}.input_layernorm.weight"), r.norm(h));
        t.insert(format!("{p}.post_attention_layernorm.weight"), r.norm(h));
    }
    t.insert("model.norm.weight".into(), r.norm(h));
    t
}

/// Writes a tiny random Qwen3 model directory: config.json, model.safetensors, the Qwen3
/// tokenizer files and generation_config.json.
pub fn write_tiny_model(dir: &Path, seed: u64) -> PathBuf {
    write_model(dir, &tiny_config(), seed)
}

/// Writes a model directory for `cfg`.
pub fn write_model(dir: &Path, cfg: &Value, seed: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(cfg).unwrap(),
    )
    .unwrap();
    let tensors = random_tensors(cfg, seed);
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

/// A model directory for `cfg` and `seed`, written once under the temp dir as `name`.
pub fn cached_model(name: &str, cfg: &Value, seed: u64) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("policy-serve-{name}"));
    if dir.join("model.safetensors").is_file() {
        return dir;
    }
    let staging =
        std::env::temp_dir().join(format!("policy-serve-{name}.{}.tmp", std::process::id()));
    write_model(&staging, cfg, seed);
    if std::fs::rename(&staging, &dir).is_err() {
        // Another process got there first; theirs is identical.
        let _ = std::fs::remove_dir_all(&staging);
    }
    dir
}
