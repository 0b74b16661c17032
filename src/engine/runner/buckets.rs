//! The batch sizes whose decode steps replay as CUDA graphs (`cuda::DecodeGraphs` captures
//! one graph per bucket; a step of `n` sequences runs on the smallest bucket that holds it,
//! padded). Plain arithmetic, so it is tested without a GPU.

/// The largest bucket: larger decode batches run eagerly.
pub const MAX_GRAPH_BUCKET: usize = 256;

/// The buckets an engine of `max_running` sequences can reach: 1-8 exact (agents step few
/// episodes at once, where padding would cost the most), then powers of two up to the first
/// one that holds `max_running`, at most [`MAX_GRAPH_BUCKET`]. Capturing only these keeps the
/// start-up short.
pub fn graph_buckets(max_running: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut b = 1;
    while b <= MAX_GRAPH_BUCKET {
        out.push(b);
        if b >= max_running {
            break;
        }
        b = if b < 8 { b + 1 } else { b * 2 };
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
        assert_eq!(graph_buckets(1), vec![1]);
        assert_eq!(graph_buckets(5), vec![1, 2, 3, 4, 5]);
        assert_eq!(graph_buckets(8), vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(graph_buckets(9), vec![1, 2, 3, 4, 5, 6, 7, 8, 16]);
        assert_eq!(graph_buckets(64), vec![1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]);
        let all = vec![1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256];
        assert_eq!(graph_buckets(256), all);
        assert_eq!(graph_buckets(10_000), all, "never past the largest bucket");
        assert_eq!(graph_buckets(0), vec![1]);
    }

    #[test]
    fn a_step_takes_the_smallest_bucket_that_holds_it() {
        let b = graph_buckets(256);
        assert_eq!(bucket_for(&b, 0), None);
        assert_eq!(bucket_for(&b, 1).map(|i| b[i]), Some(1));
        assert_eq!(bucket_for(&b, 8).map(|i| b[i]), Some(8));
        assert_eq!(bucket_for(&b, 9).map(|i| b[i]), Some(16));
        assert_eq!(bucket_for(&b, 200).map(|i| b[i]), Some(256));
        assert_eq!(bucket_for(&b, 257), None, "larger batches run eagerly");
    }
}
