//! Engine-level checks: graphs on against graphs off (and pipelined), and the stress run of
//! random arrivals with the free device memory watched.

use super::*;

pub(super) fn engine(
    a: &Args,
    graphs: bool,
    pipelined: bool,
    max_running: usize,
) -> Res<(ModelRegistry, Engine)> {
    let opts = EngineOptions {
        device: DeviceChoice::Cuda(0),
        dtype: DTypeChoice::BF16,
        max_running: Some(max_running),
        max_batched_tokens: 8192,
        prefill_chunk: 2048,
        kv_budget: KvBudget {
            gpu_gib: Some(8.0),
            ..KvBudget::default()
        },
        cuda_graphs: graphs,
        pipelined_decode: pipelined,
        kernels: a.kernels.options(),
        ..EngineOptions::default()
    };
    let r = ModelRegistry::new(vec![ModelSpec::local("m", "m", &a.model_dir)])?.with_options(opts);
    let e = r.model("m")?.engine().clone();
    Ok((r, e))
}

pub(super) fn request(prompt: Vec<u32>, n: usize) -> GenerationRequest {
    let mut r = GenerationRequest::new(prompt).max_new_tokens(n);
    r.ignore_eos = true;
    r
}

/// Check 3: graphs on vs off through the engine, staggered requests; and graphs on with
/// pipelined decode (each step launched before the previous step's tokens are read).
pub(super) fn engine_check(a: &Args, fails: &mut u32) -> Res<()> {
    let mut out = Vec::new();
    let mut pipelined_steps = 0;
    for (graphs, pipelined) in [(false, false), (true, false), (true, true)] {
        let (_r, e) = engine(a, graphs, pipelined, 64)?;
        if graphs && e.info().cuda_graph_buckets.is_empty() {
            return Err("the engine captured no graphs".into());
        }
        let pending: Vec<_> = (0..24)
            .map(|i| {
                std::thread::sleep(Duration::from_millis(4));
                e.submit(request(
                    synthetic_prompt(30 + (i * 41) % 300, 3000 + i),
                    16 + (i * 23) % 130,
                ))
            })
            .collect();
        out.push(
            pending
                .into_iter()
                .map(|p| p.wait().map(|g| g.tokens))
                .collect::<Result<Vec<_>, _>>()?,
        );
        if pipelined {
            pipelined_steps = e.stats().pipelined_steps;
        }
    }
    lockstep_check(a, fails)?;
    for (i, what) in [(1, "graphs on"), (2, "graphs on, pipelined")] {
        let equal = out[0].iter().zip(&out[i]).filter(|(x, y)| x == y).count();
        let ok = equal == 24 && (i == 1 || pipelined_steps > 0);
        *fails += u32::from(!ok);
        println!(
            "engine {what} vs graphs off: {equal}/24 requests with equal tokens{}{}",
            if i == 2 {
                format!(" ({pipelined_steps} steps launched ahead)")
            } else {
                String::new()
            },
            if ok { "" } else { " FAIL" }
        );
    }
    Ok(())
}

/// Graphs on against off with the batching held equal: 32 short requests in one
/// `submit_batch` (one prefill step, then decode steps of all 32 rows: the bucket of 32, no
/// padding). The staggered check above lets the two engines batch differently, and an MoE
/// token depends on its batch (the expert tiles differ above 8 tokens); here both engines run
/// the same steps, so any difference is the graphs'.
fn lockstep_check(a: &Args, fails: &mut u32) -> Res<()> {
    const N: usize = 32;
    let mut out = Vec::new();
    for graphs in [false, true] {
        let (_r, e) = engine(a, graphs, false, 64)?;
        let batch = (0..N).map(|i| request(synthetic_prompt(30 + (i % 8) * 9, 5000 + i), 32));
        out.push(
            e.submit_batch(batch)
                .into_iter()
                .map(|p| p.wait().map(|g| g.tokens))
                .collect::<Result<Vec<_>, _>>()?,
        );
    }
    let equal = out[0].iter().zip(&out[1]).filter(|(x, y)| x == y).count();
    *fails += u32::from(equal != N);
    println!(
        "engine lockstep ({N} requests in one batch) graphs on vs off: {equal}/{N} requests with equal tokens{}",
        if equal == N { "" } else { " FAIL" }
    );
    Ok(())
}

/// Free device memory (MiB) after the stream-ordered pool gave back what it holds unused
/// (candle's buffers come from that pool, which otherwise keeps its high-water mark).
fn free_mib(dev: &candle_core::Device) -> Res<Mem> {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    dev.synchronize()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let (mut used, mut reserved) = (0u64, 0u64);
    // SAFETY: plain driver queries on device 0, which this process uses; the attributes are
    // u64 values written into the given locations.
    unsafe {
        sys::cuDeviceGetMemPool(&mut pool, 0).result()?;
        sys::cuMemPoolTrimTo(pool, 0).result()?;
        sys::cuMemPoolGetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            (&mut used as *mut u64).cast(),
        )
        .result()?;
        sys::cuMemPoolGetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
            (&mut reserved as *mut u64).cast(),
        )
        .result()?;
    }
    let (free, _) = result::mem_get_info()?;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    Ok(Mem {
        free: mib(free as u64),
        pool_used: mib(used),
        pool_reserved: mib(reserved),
    })
}

/// Device memory at one point of the stress run, in MiB.
#[derive(Clone, Copy)]
struct Mem {
    free: f64,
    pool_used: f64,
    pool_reserved: f64,
}

/// Random arrivals on `e` until it ran `steps` more steps (or `limit` passed): bursts of 0-5
/// requests of 8-207 prompt tokens and 1-256 new tokens, 0-24 ms apart. Returns (steps run,
/// requests complete with all their tokens, requests submitted).
fn random_arrivals(e: &Engine, steps: u64, seed: u64, limit: Duration) -> (u64, usize, usize) {
    let steps0 = e.stats().steps;
    let mut rng = seed | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let t = Instant::now();
    let mut pending = Vec::new();
    while e.stats().steps - steps0 < steps && t.elapsed() < limit {
        for _ in 0..next() % 6 {
            let p = 8 + (next() % 200) as usize;
            let n = 1 + (next() % 256) as usize;
            let salt = pending.len() + seed as usize;
            pending.push((n, e.submit(request(synthetic_prompt(p, salt), n))));
        }
        std::thread::sleep(Duration::from_millis(next() % 25));
    }
    let submitted = pending.len();
    let complete = pending
        .into_iter()
        .map(|(n, p)| p.wait().is_ok_and(|g| g.tokens.len() == n))
        .filter(|ok| *ok)
        .count();
    (e.stats().steps - steps0, complete, submitted)
}

/// Check 4: 10,000+ steps of random arrivals on a graph engine after a warm-up of the same
/// process, in four quarters; device memory is read after the warm-up and after each quarter
/// (the allocation pool trimmed first): free memory, and the pool's used and reserved bytes.
/// A leak of the engine's own buffers grows the pool's used bytes; one outside the pool (the
/// driver, cuBLAS, graphs) shrinks free memory beyond what the pool reserves. The bars: used
/// bytes within 1 MiB, and free memory within 4 MiB once the pool's reserve is counted. The
/// reserve itself may grow by a 32 MiB chunk when fragmentation keeps a chunk from being
/// trimmed (seen on the H200 at random points, with used bytes unchanged); that is not a leak.
pub(super) fn stress_check(a: &Args, fails: &mut u32) -> Res<()> {
    let (_r, e) = engine(a, true, false, 256)?;
    let dev = select_device(DeviceChoice::Cuda(0))?;
    // The probe's tokens and how many of its prompt's tokens the prefix cache held: run cold
    // (nothing cached) and warm (its own blocks cached) before the stress, and once after it.
    let probe = || {
        e.generate(request(synthetic_prompt(100, 4242), 64))
            .map(|g| (g.tokens, g.cached_prompt_tokens))
    };
    let cold = probe()?;
    let warm = probe()?;
    let (w_steps, _, _) = random_arrivals(&e, 2_000, 77, Duration::from_secs(60));
    let mem0 = free_mib(&dev)?;
    let t = Instant::now();
    // Four quarters, memory read after each.
    let quarter = a.stress_steps.div_ceil(4);
    let limit = Duration::from_secs(40);
    let (mut steps, mut complete, mut submitted) = (0, 0, 0);
    let mut mems = vec![mem0];
    for (i, seed) in [
        0x9e37_79b9_7f4a_7c15u64,
        0x2545_f491_4f6c_dd1d,
        0x5851_f42d,
        0x1405_7b7e,
    ]
    .into_iter()
    .enumerate()
    {
        let (s, c, n) = random_arrivals(&e, quarter, seed + i as u64, limit);
        steps += s;
        complete += c;
        submitted += n;
        mems.push(free_mib(&dev)?);
    }
    let after = probe()?;
    // After the stress the probe finds its blocks cached, or evicted; it must give the tokens
    // of the run before that prefilled alike. (A cached prefix prefills fewer rows, and an MoE
    // token's bits depend on its step's row count, so a warm run may differ from a cold one.)
    let before = if after.1 == warm.1 { &warm } else { &cold };
    let st = e.stats();
    let last = mems[mems.len() - 1];
    let used_growth = last.pool_used - mem0.pool_used;
    // A leak raises the pool's used bytes quarter after quarter; the working set of what is in
    // flight when a quarter ends moves them down as well as up (H200: 9,620-9,636 MiB over one
    // run). So: growth above 1 MiB that rose at every quarter, or above 32 MiB at all.
    let rising = mems.windows(2).all(|w| w[1].pool_used >= w[0].pool_used);
    let leak = (rising && used_growth > 1.0) || used_growth > 32.0;
    let outside = (mem0.free - last.free) - (last.pool_reserved - mem0.pool_reserved);
    let ok = complete == submitted
        && before.0 == after.0
        && !leak
        && outside <= 4.0
        && steps >= a.stress_steps;
    *fails += u32::from(!ok);
    let trail: Vec<String> = mems.iter().map(|m| m.to_string()).collect();
    println!(
        "stress: warm-up {w_steps} steps, then {steps} steps in {:.1}s, {complete}/{submitted} requests complete, {} preemptions; probe tokens equal before/after: {} (prompt tokens cached: cold {}, warm {}, after {}; warm = cold: {}); device memory MiB after warm-up and each quarter: {}; pool used grew {used_growth:.1} MiB (rising at every quarter: {rising}), memory outside the pool {outside:.0} MiB (a steady leak would be under {:.1} KB per step); KV blocks free {}/{} (cached {}){}",
        t.elapsed().as_secs_f64(),
        st.preemptions,
        before.0 == after.0,
        cold.1,
        warm.1,
        after.1,
        cold.0 == warm.0,
        trail.join(" -> "),
        4.0f64.max(outside) * 1024.0 / steps.max(1) as f64,
        st.blocks_free,
        st.blocks_total,
        st.cached_blocks,
        if ok { "" } else { " FAIL" }
    );
    Ok(())
}

impl std::fmt::Display for Mem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "free {:.0} (pool used {:.1}, reserved {:.1})",
            self.free, self.pool_used, self.pool_reserved
        )
    }
}
