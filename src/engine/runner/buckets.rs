//! The batch sizes whose decode steps replay as CUDA graphs (`cuda::DecodeGraphs` captures
//! one graph per bucket; a step of `n` sequences runs on the smallest bucket that holds it,
//! padded). Plain arithmetic, so it is tested without a GPU.

pub use crate::engine::batch::{
    DOUBLING_UP_TO, LARGE_BUCKET_STEP, SmallSplits, bucket_bound, graph_splits, row_class,
};

/// The buckets an engine of `max_running` sequences can reach, none above `max_graph_batch`:
/// 1-8 exact (agents step few episodes at once, where padding would cost the most), powers
/// of two to [`DOUBLING_UP_TO`], then steps of [`LARGE_BUCKET_STEP`], up to the first that
/// holds `max_running`. Capturing only these keeps the start-up short.
pub fn graph_buckets(max_running: usize, max_graph_batch: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut b = 1;
    while b <= max_graph_batch.max(1) {
        out.push(b);
        if b >= max_running {
            break;
        }
        b = if b < 8 {
            b + 1
        } else if b < DOUBLING_UP_TO {
            b * 2
        } else {
            b + LARGE_BUCKET_STEP
        };
    }
    out
}

/// The index in `buckets` of the bucket a decode step of `n` sequences replays on, if any.
pub fn bucket_for(buckets: &[usize], n: usize) -> Option<usize> {
    (n > 0).then(|| buckets.iter().position(|&b| b >= n))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_stop_at_the_first_that_holds_max_running() {
        let g = |n| graph_buckets(n, 256);
        assert_eq!(g(1), vec![1]);
        assert_eq!(g(5), vec![1, 2, 3, 4, 5]);
        assert_eq!(g(8), vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(g(9), vec![1, 2, 3, 4, 5, 6, 7, 8, 16]);
        assert_eq!(g(64), vec![1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]);
        let all = vec![1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256];
        assert_eq!(g(256), all);
        assert_eq!(g(10_000), all, "never past the largest bucket");
        assert_eq!(g(0), vec![1]);
        // Above 256: steps of 128 up to the first that holds max_running.
        assert_eq!(
            graph_buckets(1024, 1024)[12..],
            [256, 384, 512, 640, 768, 896, 1024]
        );
        assert_eq!(graph_buckets(300, 1024)[12..], [256, 384]);
        assert_eq!(graph_buckets(1024, 600).last(), Some(&512));
    }

    #[test]
    fn a_step_and_its_bucket_cut_decode_attention_alike() {
        // With `KernelOptions::eager_graph_splits` an eager decode step of t rows takes
        // `graph_splits(t)` partitions, its graph bucket `graph_splits(bucket)`: equal, so both
        // cut a long context alike (the same bits). Fails if a range bound of `graph_splits`
        // falls inside a bucket (e.g. 5..=12); the asserts after the loop pin the small
        // buckets' own counts (given to the wrong sizes, the loop alone would pass).
        let mut v = graph_buckets(2048, 2048);
        v.extend((1..=8).map(|n| 5 * n));
        v.sort_unstable();
        v.dedup();
        let sets = [None, Some(8), Some(16), Some(64)];
        let all = sets.iter().flat_map(|&one| {
            sets.iter()
                .flat_map(move |&few| sets.map(|mid| SmallSplits { one, few, mid }))
        });
        for small in all {
            for t in 1..=2048 {
                let at = v[bucket_for(&v, t).expect("a bucket")];
                assert_eq!(
                    graph_splits(t, small),
                    graph_splits(at, small),
                    "{t} rows, bucket {at}"
                );
            }
        }
        let small = SmallSplits {
            one: Some(64),
            few: Some(16),
            mid: Some(4),
        };
        let counts: Vec<usize> = [1, 2, 3, 4, 5, 16, 17]
            .map(|b| graph_splits(b, small))
            .into();
        assert_eq!(counts, [64, 32, 16, 16, 4, 4, 8]);
        let counts: Vec<usize> = [1, 4, 5, 16, 17, 65]
            .map(|b| graph_splits(b, SmallSplits::default()))
            .into();
        assert_eq!(counts, [32, 32, 16, 16, 8, 4]);
    }

    #[test]
    fn a_step_and_its_bucket_share_a_row_class() {
        // The cuBLAS algorithm of a matmul is picked by row class (`CudaKernels::linear_into`):
        // an eager step and the graph bucket that would replay it must fall in one class, or
        // their rows' bits could differ. Fails if a class bound is not a bucket (e.g. classes
        // of multiples of 100) or a bucket jumps a bound (buckets of 1.5x).
        let b = graph_buckets(2048, 2048);
        for t in 3..=2048 {
            let at = b[bucket_for(&b, t).expect("a bucket")];
            assert_eq!(row_class(t), row_class(at), "{t} rows, bucket {at}");
            assert!(row_class(t) >= t);
        }
        // With the verify buckets of speculative decoding among them (K + 1 = 5 rows a
        // sequence, up to 8 sequences), as the graphs capture them.
        let mut v = graph_buckets(256, 256);
        v.extend((1..=8).map(|n| 5 * n));
        v.sort_unstable();
        v.dedup();
        for t in 3..=256usize {
            let at = v[bucket_for(&v, t).expect("a bucket")];
            assert_eq!(row_class(t), row_class(at), "{t} rows, bucket {at}");
        }
    }

    #[test]
    fn a_row_bound_rounded_by_bucket_bound_splits_steps_as_their_buckets() {
        // The fused attention's row bounds choose by a step's rows eagerly and by its bucket's
        // in a graph: rounded by `bucket_bound`, both sides agree for every step, the verify
        // buckets (5 rows a sequence) among them. Fails if a bound were left as given (12: an
        // 11-row step fused eagerly, its 15-row bucket not).
        let mut v = graph_buckets(1024, 1024);
        v.extend((1..=8).map(|n| 5 * n));
        v.sort_unstable();
        v.dedup();
        for n in 1..=700 {
            let b = bucket_bound(n);
            assert!(b <= n && b >= 1, "{n} -> {b}");
            for t in 1..=1024 {
                let at = v[bucket_for(&v, t).expect("a bucket")];
                assert_eq!(t <= b, at <= b, "bound {n} -> {b}, {t} rows, bucket {at}");
            }
        }
        assert_eq!(
            [1, 8, 9, 12, 16, 17, 300].map(bucket_bound),
            [1, 8, 8, 8, 16, 16, 256]
        );
    }

    #[test]
    fn a_step_takes_the_smallest_bucket_that_holds_it() {
        let b = graph_buckets(256, 256);
        assert_eq!(bucket_for(&b, 0), None);
        assert_eq!(bucket_for(&b, 1).map(|i| b[i]), Some(1));
        assert_eq!(bucket_for(&b, 8).map(|i| b[i]), Some(8));
        assert_eq!(bucket_for(&b, 9).map(|i| b[i]), Some(16));
        assert_eq!(bucket_for(&b, 200).map(|i| b[i]), Some(256));
        assert_eq!(bucket_for(&b, 257), None, "larger batches run eagerly");
    }
}
