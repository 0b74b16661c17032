//! Decode latency while a long prompt prefills: 8 sequences decode (streaming), then one
//! prompt of `--prompt` tokens arrives; the longest gap between two streamed chunks of a
//! decoding sequence while the prompt prefills says how long chunked prefill stalls decode,
//! and the prompt's time to first token what the chunking costs it.

use std::time::{Duration, Instant};

use policy_serve::{Engine, GenerationRequest};

use super::prompt;

/// Prints one `ours mixed` row for the engine's prefill chunk.
pub(crate) fn mixed_latency(
    engine: &Engine,
    long_prompt: usize,
    chunk: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let one = |p: Vec<u32>, n: usize| {
        let mut r = GenerationRequest::new(p).max_new_tokens(n);
        r.ignore_eos = true;
        r
    };
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let mut readers = Vec::new();
    let mut pending = Vec::new();
    for i in 0..8 {
        let (p, mut stream) = engine.submit_streaming(one(prompt(512, 5000 + i), 3000));
        pending.push(p);
        let tx = started_tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut times = Vec::new();
            while stream.next_blocking().is_some() {
                times.push(Instant::now());
                if times.len() == 2 {
                    let _ = tx.send(());
                }
            }
            times
        }));
    }
    for _ in 0..8 {
        started_rx.recv_timeout(Duration::from_secs(60))?;
    }
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    let long = engine.generate(one(prompt(long_prompt, 7), 1))?;
    let t1 = Instant::now();
    for p in pending {
        p.wait()?;
    }
    let (mut during, mut before) = (Duration::ZERO, Vec::new());
    for r in readers {
        let times = r.join().map_err(|_| "stream reader panicked")?;
        for w in times.windows(2) {
            let gap = w[1] - w[0];
            if w[1] > t0 && w[0] < t1 {
                during = during.max(gap);
            } else if w[1] <= t0 {
                before.push(gap);
            }
        }
    }
    before.sort();
    let p50 = before.get(before.len() / 2).copied().unwrap_or_default();
    println!(
        "ours mixed P={long_prompt} chunk={chunk}: prompt ttft_ms {:.1}; decode gap while it \
         prefills max_ms {:.1} (before: p50_ms {:.2})",
        long.time_to_first_token.as_secs_f64() * 1e3,
        during.as_secs_f64() * 1e3,
        p50.as_secs_f64() * 1e3
    );
    Ok(())
}
