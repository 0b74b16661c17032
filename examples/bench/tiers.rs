//! `--tiers-resume LEN,...`: the time to first token of resuming one LEN-token transcript
//! whose KV is on the GPU, in host memory, on disk, or nowhere (recompute), on one engine whose
//! GPU pool holds 1.5 transcripts and whose host tier holds 3.5 (the disk the rest): filler
//! prompts push the transcript down a tier between resumes. Then the same engine with the
//! measured load policy (what `--kv-load measured` chooses from host). Each row prints where its prompt
//! tokens came from (the engine's per-tier counts), so a row measures what it says.

use std::path::Path;

use policy_serve::engine::{KvBudget, KvDiskOptions, KvLoad};
use policy_serve::testing::synthetic_prompt;
use policy_serve::{EngineOptions, GenerationRequest};

use crate::engine_on;

const GIB: f64 = (1u64 << 30) as f64;

pub(crate) fn tiers_resume(
    dir: &Path,
    opts: &EngineOptions,
    cfg: &serde_json::Value,
    lens: &[usize],
) -> Result<(), Box<dyn std::error::Error>> {
    let get = |k: &str| cfg[k].as_u64().unwrap_or(0) as usize;
    let head_dim = cfg["head_dim"].as_u64().map_or(
        get("hidden_size") / get("num_attention_heads").max(1),
        |h| h as usize,
    );
    // bf16 K and V of every layer.
    let per_token = get("num_hidden_layers") * 2 * get("num_key_value_heads") * head_dim * 2;
    println!(
        "| transcript | from | prompt tokens | GPU | host | disk | TTFT ms | answer = recompute's |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &len in lens {
        let bytes = (len * per_token) as f64;
        let disk = std::env::temp_dir().join(format!("policy-serve-tiers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&disk);
        let (registry, engine) = engine_on(dir, engine_options(opts, bytes, &disk))?;
        let transcript = synthetic_prompt(len, 1);
        let run = |salt: usize, tail: usize| one(&engine, &transcript, len, salt, tail);
        let first = std::cell::RefCell::new(None::<Vec<u32>>);
        let row = |from: &str, g: &policy_serve::Generation| {
            let below = g.cached_prompt_tokens_host + g.cached_prompt_tokens_disk;
            let same = first.borrow_mut().get_or_insert_with(|| g.tokens.clone()) == &g.tokens;
            println!(
                "| {len} | {from} | {} | {} | {} | {} | {:.1} | {} |",
                g.prompt_tokens,
                g.cached_prompt_tokens - below,
                g.cached_prompt_tokens_host,
                g.cached_prompt_tokens_disk,
                g.time_to_first_token.as_secs_f64() * 1e3,
                if same { "yes" } else { "NO" }
            );
            // A row whose tokens did not come from the tier it is named after says so (the
            // 32k "disk" row once loaded from host and read like a fast disk).
            let (gpu, host, disk) = (
                g.cached_prompt_tokens - below,
                g.cached_prompt_tokens_host,
                g.cached_prompt_tokens_disk,
            );
            let as_named = match from.split(' ').next() {
                Some("recompute") => g.cached_prompt_tokens == 0,
                Some("GPU") => gpu >= host + disk && gpu > 0,
                Some("host" | "host,") => host >= gpu + disk && host > 0,
                Some("disk") => disk >= gpu + host && disk > 0,
                _ => true,
            };
            if !as_named {
                println!(
                    "# WARNING {len} {from}: the prompt's cached tokens came from GPU {gpu} / host {host} / disk {disk}, not mostly from the tier the row is named after"
                );
            }
        };
        row("recompute", &run(0, 1)?);
        // A paused episode pins its transcript: when the disk cannot keep up, unpinned blocks
        // are dropped rather than waited for; this one is written.
        let _pin = engine.pin_kv(transcript.clone(), None);
        row("GPU", &run(0, 2)?);
        for salt in 10..12 {
            run(salt, 0)?;
        }
        row("host", &run(0, 3)?);
        for salt in 12..17 {
            run(salt, 0)?;
        }
        // Let the disk writer finish, so the row reads files, not blocks still queued.
        std::thread::sleep(std::time::Duration::from_secs(2));
        // Best effort: drop the page cache, so "disk" reads the device (root only).
        let _ = std::process::Command::new("sync").status();
        let cold = std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok();
        row(
            if cold {
                "disk (page cache dropped)"
            } else {
                "disk (page cache warm)"
            },
            &run(0, 4)?,
        );
        if let Some(t) = engine.stats().kv_tiers {
            println!("# {len}: {t:?}");
        }
        // The measured policy on a fresh engine: what it picks for a transcript in host memory.
        drop(engine);
        drop(registry);
        let _ = std::fs::remove_dir_all(&disk);
        let measured = EngineOptions {
            kv_load: KvLoad::Measured,
            ..engine_options(opts, bytes, &disk)
        };
        let (registry, engine) = engine_on(dir, measured)?;
        let run = |salt: usize, tail: usize| one(&engine, &transcript, len, salt, tail);
        run(0, 1)?;
        for salt in 10..12 {
            run(salt, 0)?;
        }
        row("host, measured policy", &run(0, 3)?);
        if let Some(t) = engine.stats().kv_tiers {
            println!(
                "# {len}: measured at start-up: host-to-device {:.1} GB/s, prefill {:.0} tok/s; recomputes chosen {}",
                t.measured_load_bytes_per_s / 1e9,
                t.measured_prefill_tokens_per_s,
                t.recomputes_chosen
            );
        }
        drop(engine);
        drop(registry);
        let _ = std::fs::remove_dir_all(&disk);
    }
    Ok(())
}

/// The engine of one transcript length: a GPU pool of 1.5 transcripts, host 3.5, disk 8; loads
/// always (the rows measure the copies whatever they cost).
fn engine_options(opts: &EngineOptions, bytes: f64, disk: &Path) -> EngineOptions {
    EngineOptions {
        kv_budget: KvBudget {
            gpu_gib: Some(1.5 * bytes / GIB),
            ..KvBudget::default()
        },
        kv_host_gib: 3.5 * bytes / GIB,
        kv_disk: Some(KvDiskOptions {
            dir: disk.to_path_buf(),
            gib: 8.0 * bytes / GIB,
        }),
        kv_load: KvLoad::Always,
        max_running: Some(4),
        ..opts.clone()
    }
}

/// One request of 8 greedy tokens: the transcript plus a fixed 32-token tail (`tail` > 0), or
/// a filler of `len` tokens (`tail` 0, seeded by `salt`).
fn one(
    engine: &policy_serve::Engine,
    transcript: &[u32],
    len: usize,
    salt: usize,
    tail: usize,
) -> Result<policy_serve::Generation, policy_serve::Error> {
    let mut t = if tail == 0 {
        synthetic_prompt(len, salt)
    } else {
        transcript.to_vec()
    };
    // The transcript's rows share one tail, so their greedy answers must be equal.
    t.extend(synthetic_prompt(
        32,
        if tail == 0 { 1000 + salt } else { 7 },
    ));
    engine.generate(GenerationRequest::new(t).max_new_tokens(8))
}
