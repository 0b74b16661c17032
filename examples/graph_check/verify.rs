//! Check 1b: steps that verify speculative drafts (a sequence's last token and K drafts, one
//! graph row per position) against the same tokens decoded one eager step at a time.

use candle_core::{D, Tensor};
use policy_serve::engine::batch::{LogitRows, SeqInput};
use policy_serve::engine::model::Model;
use policy_serve::engine::model::kv_cache::PagedKvCache;
use policy_serve::engine::runner::graphs::DecodeGraphs;
use policy_serve::testing::synthetic_prompt;

use super::{BS, Path, Res, Seq, decode, prefill, row_rel, table_for};

/// For 1, 2, 5 and 8 sequences with K = 4: each sequence's next five greedy tokens decoded
/// eagerly one step at a time (the reference logits), then the same five tokens fed to one
/// verify step on the graphs (cache 1): every row's argmax equal and its logits within 1e-3
/// relative. The reference steps carry filler sequences up to the verify step's row count,
/// so that both run the matmuls of one row count (a matmul's rounding depends on it: ~1e-2
/// on these random weights between 1 and 5 rows). A reference step of at most
/// `FUSED_MAX_ROWS` rows runs the fused decode attention, whose rounding differs from the
/// unfused path a verify runs (~1e-2 here): such rows are held to equal argmax only (run with
/// `--no-fused-decode` to hold them to 1e-3 too; on the H200 every row is then bit-equal).
/// With `shared` (`--shared-kv-verify`: the verify attention cuts partitions by each chunk's
/// longest context, so its rounding differs too) rows need equal argmax and logits within
/// 5e-2. A graph that let a row attend past its position, or read KV before the other rows
/// wrote it (the fused attention), fails.
pub(super) fn verify_check(
    m: &Model,
    caches: &[PagedKvCache; 2],
    g: &DecodeGraphs,
    (fused, shared): (bool, bool),
    fails: &mut u32,
) -> Res<()> {
    const K: usize = 4;
    println!("| verify sequences | rows | equal argmax | max logits rel err |");
    println!("|---|---|---|---|");
    for n in [1usize, 2, 5, 8] {
        let width = (300 + K + 2).div_ceil(BS);
        let mk = || -> Vec<Seq> {
            (0..n)
                .map(|i| Seq {
                    tokens: synthetic_prompt(20 + (i * 61) % 280, 4000 + i),
                    table: table_for(i, width),
                })
                .collect()
        };
        let (mut eager, mut graph) = (mk(), mk());
        let mut fillers: Vec<Seq> = (0..n * K)
            .map(|i| Seq {
                tokens: synthetic_prompt(30 + (i * 17) % 200, 5000 + i),
                table: table_for(n + i, width),
            })
            .collect();
        prefill(m, &caches[0], &mut eager.iter_mut().collect::<Vec<_>>())?;
        prefill(m, &caches[0], &mut fillers.iter_mut().collect::<Vec<_>>())?;
        prefill(m, &caches[1], &mut graph.iter_mut().collect::<Vec<_>>())?;
        // Reference: K + 1 plain eager steps of n * (K + 1) rows (the sequences first, then
        // the fillers); row j of sequence i is step j's row i.
        let mut steps = Vec::new();
        for _ in 0..=K {
            let mut batch: Vec<&mut Seq> = eager.iter_mut().chain(fillers.iter_mut()).collect();
            steps.push(decode(m, &caches[0], &Path::Eager, &mut batch)?);
        }
        let mut rows = Vec::new();
        for i in 0..n {
            for s in &steps {
                rows.push(s.get(i)?);
            }
        }
        let reference = Tensor::stack(&rows, 0)?;
        // The verify step: each sequence's last token and the K tokens the eager run drew
        // after it (drafts that are all right: every row is compared).
        let mut tokens = Vec::new();
        for (e, s) in eager.iter().zip(&graph) {
            let at = s.tokens.len() - 1;
            tokens.extend_from_slice(&e.tokens[at..at + K + 1]);
        }
        let inputs: Vec<SeqInput<'_>> = graph
            .iter()
            .map(|s| SeqInput {
                q_len: K + 1,
                context_len: s.tokens.len() + K,
                block_table: &s.table,
                logits: LogitRows::All,
                adapter: None,
            })
            .collect();
        let got = g
            .replay(m, &tokens, &inputs)?
            .ok_or("the verify step did not replay on a graph")?
            .copy()?;
        let a: Vec<u32> = reference.argmax(D::Minus1)?.to_vec1()?;
        let b: Vec<u32> = got.argmax(D::Minus1)?.to_vec1()?;
        let equal = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        let worst = row_rel(&reference, &got)?;
        let rows = n * (K + 1);
        let fused_reference = fused && rows <= policy_serve::engine::cuda::FUSED_MAX_ROWS;
        let tol = if shared { 5e-2 } else { 1e-3 };
        let ok = equal == a.len() && ((fused_reference && !shared) || worst <= tol);
        *fails += u32::from(!ok);
        println!(
            "| {n} | {rows} | {equal}/{} | {worst:.2e}{} |{}",
            a.len(),
            match (shared, fused_reference) {
                (true, _) => " (shared K/V)",
                (false, true) => " (fused reference)",
                (false, false) => "",
            },
            if ok { "" } else { " FAIL" }
        );
    }
    Ok(())
}
