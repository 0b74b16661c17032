//! A float64 reference of transformers' `Qwen3MoeForCausalLM`, written out from the HF
//! code's math: RMSNorm, q/k norms, RoPE (rotate-half), causal GQA attention, the router's
//! softmax and top-k (renormalized when `norm_topk_prob`), SwiGLU experts and dense MLPs.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device};
use serde_json::Value;

pub(crate) struct Reference {
    cfg: Value,
    t: HashMap<String, (Vec<usize>, Vec<f64>)>,
}

impl Reference {
    pub(crate) fn load(dir: &Path) -> Self {
        let cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let raw =
            candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
        let t = raw
            .into_iter()
            .map(|(n, v)| {
                let shape = v.dims().to_vec();
                let data = v
                    .to_dtype(DType::F64)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap();
                (n, (shape, data))
            })
            .collect();
        Self { cfg, t }
    }

    fn u(&self, k: &str) -> usize {
        self.cfg[k].as_u64().unwrap() as usize
    }

    fn w(&self, name: &str) -> &[f64] {
        &self.t.get(name).unwrap_or_else(|| panic!("{name}")).1
    }

    /// `x` `[n]` times `W^T` for `W` `[out, n]`.
    fn linear(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let (shape, w) = &self.t[name];
        let n = shape[1];
        w.chunks(n)
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn rms(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let eps = self.cfg["rms_norm_eps"].as_f64().unwrap();
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter().zip(self.w(name)).map(|(v, g)| v * r * g).collect()
    }

    fn mlp(&self, p: &str, x: &[f64]) -> Vec<f64> {
        let g = self.linear(&format!("{p}.gate_proj.weight"), x);
        let u = self.linear(&format!("{p}.up_proj.weight"), x);
        let a: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        self.linear(&format!("{p}.down_proj.weight"), &a)
    }

    fn moe(&self, p: &str, x: &[f64]) -> Vec<f64> {
        let logits = self.linear(&format!("{p}.gate.weight"), x);
        let m = logits.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
        let probs: Vec<f64> = logits.iter().map(|l| (l - m).exp() / z).collect();
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let top = &order[..self.u("num_experts_per_tok")];
        let sum: f64 = top.iter().map(|&e| probs[e]).sum();
        let norm = self.cfg["norm_topk_prob"].as_bool().unwrap();
        let mut out = vec![0.0; x.len()];
        for &e in top {
            let w = if norm { probs[e] / sum } else { probs[e] };
            let y = self.mlp(&format!("{p}.experts.{e}"), x);
            for (o, y) in out.iter_mut().zip(y) {
                *o += w * y;
            }
        }
        out
    }

    /// Logits of every position of `tokens`.
    pub(crate) fn logits(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let (h, nh, nkv, hd) = (
            self.u("hidden_size"),
            self.u("num_attention_heads"),
            self.u("num_key_value_heads"),
            self.u("head_dim"),
        );
        let theta = self.cfg["rope_theta"].as_f64().unwrap();
        let embed = self.w("model.embed_tokens.weight");
        let mut xs: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| embed[t as usize * h..(t as usize + 1) * h].to_vec())
            .collect();
        let sparse_step = self.u("decoder_sparse_step");
        let dense_layers: Vec<usize> = self.cfg["mlp_only_layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let rope = |v: &mut [f64], pos: usize| {
            let half = hd / 2;
            for i in 0..half {
                let f = pos as f64 / theta.powf(2.0 * i as f64 / hd as f64);
                let (s, c) = f.sin_cos();
                let (a, b) = (v[i], v[i + half]);
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        };
        for li in 0..self.u("num_hidden_layers") {
            let p = format!("model.layers.{li}");
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (pos, x) in xs.iter().enumerate() {
                let n = self.rms(&format!("{p}.input_layernorm.weight"), x);
                let mut q = self.linear(&format!("{p}.self_attn.q_proj.weight"), &n);
                let mut k = self.linear(&format!("{p}.self_attn.k_proj.weight"), &n);
                let v = self.linear(&format!("{p}.self_attn.v_proj.weight"), &n);
                for head in q.chunks_mut(hd) {
                    let normed = self.rms(&format!("{p}.self_attn.q_norm.weight"), head);
                    head.copy_from_slice(&normed);
                    rope(head, pos);
                }
                for head in k.chunks_mut(hd) {
                    let normed = self.rms(&format!("{p}.self_attn.k_norm.weight"), head);
                    head.copy_from_slice(&normed);
                    rope(head, pos);
                }
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            for (pos, x) in xs.iter_mut().enumerate() {
                let mut attn = vec![0.0; nh * hd];
                for head in 0..nh {
                    let kvh = head / (nh / nkv);
                    let q = &qs[pos][head * hd..(head + 1) * hd];
                    let scores: Vec<f64> = (0..=pos)
                        .map(|j| {
                            let k = &ks[j][kvh * hd..(kvh + 1) * hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                    for (j, s) in scores.iter().enumerate() {
                        let w = (s - m).exp() / z;
                        let v = &vs[j][kvh * hd..(kvh + 1) * hd];
                        for d in 0..hd {
                            attn[head * hd + d] += w * v[d];
                        }
                    }
                }
                let o = self.linear(&format!("{p}.self_attn.o_proj.weight"), &attn);
                for (a, b) in x.iter_mut().zip(o) {
                    *a += b;
                }
                let n = self.rms(&format!("{p}.post_attention_layernorm.weight"), x);
                let sparse = !dense_layers.contains(&li) && (li + 1) % sparse_step == 0;
                let y = if sparse {
                    self.moe(&format!("{p}.mlp"), &n)
                } else {
                    self.mlp(&format!("{p}.mlp"), &n)
                };
                for (a, b) in x.iter_mut().zip(y) {
                    *a += b;
                }
            }
        }
        xs.iter()
            .map(|x| {
                let n = self.rms("model.norm.weight", x);
                self.linear("model.embed_tokens.weight", &n)
            })
            .collect()
    }
}

pub(crate) fn argmax(row: &[f64]) -> u32 {
    row.iter()
        .enumerate()
        .fold((0, f64::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
        .0 as u32
}
