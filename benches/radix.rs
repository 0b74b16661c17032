//! Hot CPU paths of the prefix cache: lookup and insert on a tree of 10k cached sequences; the
//! KV tiers' bookkeeping of an agent turn (admission with loads from a full host tier,
//! eviction with demotion, release), with a device that moves nothing.
//!
//!     cargo bench --bench radix

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use std::sync::Arc;

use policy_serve::cache::{
    BlockData, BlockIo, BlockPool, KvManager, LoadPolicy, LoadTicket, RadixCache, TierConfig, Tiers,
};

const BS: usize = 16;

/// 10k agent-like sequences: 100 tasks share a 704-token system+tools prefix each task's
/// 100 episodes branch off after it with their own ~320 tokens.
fn sequences() -> Vec<Vec<u32>> {
    let mut out = Vec::with_capacity(10_000);
    for task in 0..100u32 {
        let prefix: Vec<u32> = (0..704).map(|i| (i * 31 + task * 7919) % 151_000).collect();
        for ep in 0..100u32 {
            let mut s = prefix.clone();
            s.extend((0..320).map(|i| (i * 17 + ep * 104_729 + task) % 151_000));
            out.push(s);
        }
    }
    out
}

fn build(seqs: &[Vec<u32>]) -> (RadixCache, BlockPool) {
    let mut pool = BlockPool::new(1 << 20);
    let mut tree = RadixCache::new(BS);
    for s in seqs {
        let blocks = pool.allocate(s.len() / BS).expect("pool is large");
        tree.insert(s, &blocks, &mut pool).expect("insert");
        pool.release(&blocks).expect("release");
    }
    (tree, pool)
}

fn bench(c: &mut Criterion) {
    let seqs = sequences();
    let (mut tree, mut pool) = build(&seqs);
    let mut i = 0;
    c.bench_function("radix lookup+release (1024 tokens, 10k-seq tree)", |b| {
        b.iter(|| {
            let m = tree.lookup(black_box(&seqs[i % seqs.len()]));
            tree.release(m.node);
            i += 7;
        })
    });
    let mut j = 0u32;
    c.bench_function(
        "radix insert new branch (320 tokens after a shared 704)",
        |b| {
            b.iter(|| {
                let mut s = seqs[(j as usize * 13) % seqs.len()][..704].to_vec();
                s.extend((0..320).map(|k| (k * 3 + j * 999_983) % 151_000));
                let blocks = pool.allocate(s.len() / BS).expect("pool");
                tree.insert(black_box(&s), &blocks, &mut pool)
                    .expect("insert");
                pool.release(&blocks).expect("release");
                if pool.num_free() < 100_000 {
                    // Keep the tree bounded: LRU eviction is part of steady-state insert cost.
                    tree.evict(200_000, &mut pool).expect("evict");
                }
                j += 1;
            })
        },
    );
    c.bench_function(
        "radix evict 1000 blocks (LRU leaves of a 2k-seq tree)",
        |b| {
            b.iter_batched(
                || build(&seqs[..2_000]),
                |(mut t, mut p)| t.evict(black_box(1_000), &mut p).expect("evict"),
                criterion::BatchSize::LargeInput,
            )
        },
    );
    c.bench_function("radix build 10k sequences", |b| {
        b.iter(|| build(black_box(&seqs[..10_000])))
    });
}

/// A device whose blocks are 16 bytes and whose moves cost nothing: what is left is the tiers'
/// own work on the scheduler's thread.
struct NoDevice;

impl BlockIo for NoDevice {
    fn read(&self, blocks: &[u32]) -> policy_serve::Result<Vec<BlockData>> {
        Ok(blocks
            .iter()
            .map(|_| Arc::new(vec![0u8; 16]) as BlockData)
            .collect())
    }
    fn write(&self, _: &[u32], _: &[BlockData]) -> policy_serve::Result<Option<LoadTicket>> {
        Ok(None)
    }
}

/// The agent workload of BENCHMARKS.md's tier rows, bookkeeping only: 128 transcripts growing
/// by ~690 tokens a turn over a 17,554-block GPU pool and a 37,449-block host tier; one
/// iteration is one turn of one episode (admit with loads, release with its answer).
fn tiers(c: &mut Criterion) {
    let mut kv = KvManager::new(17_554, BS, 16, true, 0);
    kv.set_tiers(Tiers::new(
        TierConfig {
            host_bytes: 37_449 * 16,
            disk: None,
            load: LoadPolicy::Always,
            model: "bench".into(),
            layout: "bench".into(),
            block_size: BS,
            block_bytes: 16,
        },
        Box::new(NoDevice),
    ));
    let mut ts: Vec<Vec<u32>> = (0..128u32)
        .map(|e| {
            let mut t: Vec<u32> = (0..700).collect();
            t.extend((0..32).map(|x| e * 100_000 + x));
            t
        })
        .collect();
    let mut turn = 0u32;
    c.bench_function("tiers: one agent turn (admit with loads, release)", |b| {
        b.iter(|| {
            let e = (turn % 128) as usize;
            let t = &mut ts[e];
            if t.len() > 8_000 {
                t.truncate(732);
            }
            t.extend((0..690).map(|x| e as u32 * 100_000 + (turn / 128) * 1000 + x + 50));
            let a = kv
                .admit(black_box(t), t.len() + 41, |_| false)
                .expect("room");
            let mut full = t.clone();
            full.extend((0..40).map(|x| 7_000_000 + x));
            kv.release(&full, &a.blocks, a.pin);
            turn += 1;
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench, tiers
}
criterion_main!(benches);
