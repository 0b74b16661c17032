//! The KV tiers below the GPU with the tiny model and a 12-block pool: a paused episode's
//! transcript is pushed to host and disk by other requests and comes back on resume, counted
//! per tier, with the greedy answer of a run that never evicted; corrupt or truncated block
//! files and a disk that goes away are recomputed around; a restarted engine over the same
//! weights reuses the disk's blocks, one over changed weights none.

use std::path::{Path, PathBuf};

use policy_serve::engine::{KvBudget, KvDiskOptions, KvLoad};
use policy_serve::{
    Engine, EngineOptions, Generation, GenerationRequest, ModelRegistry, ModelSpec,
};

use super::{common, options, registry_with};
use common::prompt;

/// One block of the tiny model's KV: 2 layers x K,V x 2 heads x 16 dims x 16 tokens x f32.
const BLOCK_BYTES: f64 = 8192.0;

pub(crate) fn tier_options(host_blocks: usize, disk: Option<&Path>) -> EngineOptions {
    EngineOptions {
        kv_budget: KvBudget {
            blocks: Some(12),
            ..KvBudget::default()
        },
        kv_host_gib: host_blocks as f64 * BLOCK_BYTES / (1u64 << 30) as f64,
        kv_disk: disk.map(|d| KvDiskOptions {
            dir: d.to_path_buf(),
            gib: 1.0,
        }),
        kv_load: KvLoad::Always,
        ..options()
    }
}

pub(crate) fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ps-tiers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub(crate) fn greedy(engine: &Engine, tokens: Vec<u32>) -> Generation {
    engine
        .generate(GenerationRequest::new(tokens).max_new_tokens(8))
        .unwrap()
}

/// An episode's first turn, its transcript pinned; then six other prompts that push it off
/// the GPU. Returns the transcript of the next turn (the old one plus a tool's answer).
pub(crate) fn pause(engine: &Engine) -> (Vec<u32>, policy_serve::KvPin) {
    let mut transcript = prompt(100, 1);
    let g = greedy(engine, transcript.clone());
    transcript.extend(&g.tokens);
    let pin = engine.pin_kv(transcript.clone(), None);
    for salt in 2..8 {
        greedy(engine, prompt(100, salt));
    }
    transcript.extend(prompt(20, 99));
    // Disk writes run on a thread of their own: let them land before anyone looks.
    std::thread::sleep(std::time::Duration::from_millis(300));
    (transcript, pin)
}

fn reference(next: &[u32]) -> Vec<u32> {
    let r = registry_with(options());
    greedy(r.model("tiny").unwrap().engine(), next.to_vec()).tokens
}

#[test]
fn a_paused_transcript_comes_back_from_host_and_disk_with_the_same_answer() {
    let dir = temp_dir("resume");
    let r = registry_with(tier_options(3, Some(&dir)));
    let engine = r.model("tiny").unwrap().engine().clone();
    let (next, _pin) = pause(&engine);
    let t = engine.stats().kv_tiers.expect("tiers on");
    assert!(
        t.demoted_blocks > 0 && t.spilled_blocks > 0 && t.disk_on,
        "{t:?}"
    );
    // The resume loads while two other requests run beside it: every answer is its own.
    let others = [prompt(40, 50), prompt(30, 51)];
    let pending: Vec<_> = std::iter::once(next.clone())
        .chain(others.iter().cloned())
        .map(|p| engine.submit(GenerationRequest::new(p).max_new_tokens(8)))
        .collect();
    let mut got: Vec<Generation> = pending.into_iter().map(|p| p.wait().unwrap()).collect();
    for (o, g) in others.iter().zip(&got[1..]) {
        assert_eq!(g.tokens, reference(o));
    }
    let g = got.swap_remove(0);
    assert_eq!(
        g.tokens,
        reference(&next),
        "the reloaded KV gives the same answer"
    );
    // Everything of the old transcript but its last (never computed) token is whole blocks
    // of 16 from the tiers.
    let old = next.len() - 20;
    assert!(g.cached_prompt_tokens >= (old - 1) / 16 * 16, "{g:?}");
    assert!(g.cached_prompt_tokens_disk > 0, "{g:?}");
    let t = engine.stats().kv_tiers.unwrap();
    assert!(t.disk_loads > 0 && t.load_bytes > 0, "{t:?}");
    assert_eq!(t.checksum_failures, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Disk blocks are read off the scheduler's thread after admission, which counts them as
/// cached until the reads say otherwise. Mutations caught: a sequence not cut back to the
/// blocks that came (garbage KV: other tokens), its prompt counts left as admission guessed
/// (disk tokens reported for blocks that never loaded).
#[test]
fn corrupt_and_truncated_block_files_and_a_vanished_disk_are_recomputed() {
    let dir = temp_dir("corrupt");
    let r = registry_with(tier_options(3, Some(&dir)));
    let engine = r.model("tiny").unwrap().engine().clone();
    let (next, _pin) = pause(&engine);
    // Every block file on disk: one byte flipped in half of them, the others cut short.
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kv"))
        .collect();
    assert!(!files.is_empty());
    for (i, f) in files.iter().enumerate() {
        let mut b = std::fs::read(f).unwrap();
        if i % 2 == 0 {
            let at = b.len() - 100;
            b[at] ^= 0x40;
        } else {
            b.truncate(b.len() / 2);
        }
        std::fs::write(f, b).unwrap();
    }
    let g = greedy(&engine, next.clone());
    assert_eq!(g.tokens, reference(&next));
    let t = engine.stats().kv_tiers.unwrap();
    assert!(t.checksum_failures >= 1, "{t:?}");
    assert_eq!(
        g.cached_prompt_tokens_disk, 0,
        "no disk block loaded: {g:?}"
    );
    // The disk goes away (a file where the directory was): the tier turns off, serving goes on.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    for salt in 10..16 {
        greedy(&engine, prompt(100, salt));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let g = greedy(&engine, next.clone());
    assert_eq!(g.tokens, reference(&next));
    assert!(!engine.stats().kv_tiers.unwrap().disk_on);
    let _ = std::fs::remove_file(&dir);
}

#[test]
fn a_restarted_engine_reuses_the_disk_over_the_same_weights_only() {
    let dir = temp_dir("restart");
    // One host block: nearly everything evicted goes on to disk.
    let next = {
        let r = registry_with(tier_options(1, Some(&dir)));
        let (next, _pin) = pause(r.model("tiny").unwrap().engine());
        next
    };
    let r = registry_with(tier_options(1, Some(&dir)));
    let g = greedy(r.model("tiny").unwrap().engine(), next.clone());
    assert!(g.cached_prompt_tokens_disk > 0, "{g:?}");
    assert_eq!(g.tokens, reference(&next));
    drop(r);
    // The same architecture with other weights: nothing on disk is theirs.
    let other = temp_dir("restart-weights");
    common::write_tiny_model(&other, 43);
    let r = ModelRegistry::new(vec![ModelSpec::local("tiny", "Tiny", other.clone())])
        .unwrap()
        .with_options(tier_options(1, Some(&dir)));
    let g = greedy(r.model("tiny").unwrap().engine(), next);
    assert_eq!(
        (g.cached_prompt_tokens_disk, g.cached_prompt_tokens),
        (0, 0)
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other);
}
