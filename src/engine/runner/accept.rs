//! Which speculative drafts a verify step keeps, decided where the draws are: on the device
//! with the engine's kernels (`CudaKernels::spec_accept`: the drawn tokens and the kept counts
//! in one buffer, one read to the host), on the host otherwise, by the same rule
//! ([`kept_drafts`]).

use candle_core::Tensor;

use super::ModelRunner;
use crate::error::Result;

/// The rule: `ids` are the tokens drawn from a step's logits rows, `drafts[r]` the token row
/// `r`'s draw must equal for the next draft to stand (`u32::MAX` after a sequence's last
/// draft, and for rows without drafts), `starts` (`seqs + 1` offsets) where each sequence's
/// rows begin. Each sequence keeps its leading drafts equal to the draw of the row before
/// them: a draft that equals the target's choice is the token the target would have drawn,
/// greedy or (with each row's own uniform number) sampled.
pub fn kept_drafts(ids: &[u32], drafts: &[u32], starts: &[u32]) -> Vec<u32> {
    starts
        .windows(2)
        .map(|w| {
            let (a, b) = (w[0] as usize, w[1] as usize);
            let mut k = 0;
            while a + k + 1 < b && ids[a + k] == drafts[a + k] {
                k += 1;
            }
            k as u32
        })
        .collect()
}

impl ModelRunner {
    /// The tokens drawn (`ids`, u32 `[rows]` on the device) and each sequence's count of kept
    /// drafts ([`kept_drafts`]'s arguments), read to the host together.
    pub(crate) fn accept_drafts(
        &self,
        ids: &Tensor,
        drafts: &[u32],
        starts: &[u32],
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        #[cfg(feature = "cuda")]
        if let Some(k) = &self.model.kernels {
            let rows = drafts.len();
            let up = k.upload_u32(&[drafts, starts].concat())?;
            let (d, s) = (up.narrow(0, 0, rows)?, up.narrow(0, rows, starts.len())?);
            let mut both: Vec<u32> = k.spec_accept(ids, &d, &s)?.to_vec1()?;
            let kept = both.split_off(rows);
            return Ok((both, kept));
        }
        let chosen: Vec<u32> = ids.to_vec1()?;
        let kept = kept_drafts(&chosen, drafts, starts);
        Ok((chosen, kept))
    }
}

#[cfg(test)]
mod tests {
    use super::kept_drafts;

    /// Drafts 5, 6, 7 of one sequence (rows 0-3) and a decode row (row 4): kept while each
    /// equals the draw of the row before it (mutation: counting every equal draft, not the
    /// leading ones, keeps 2 in the third case).
    #[test]
    fn drafts_are_kept_while_they_equal_the_models_choice() {
        let m = u32::MAX;
        let drafts = [5, 6, 7, m, m];
        let starts = [0, 4, 5];
        assert_eq!(kept_drafts(&[5, 6, 9, 1, 3], &drafts, &starts), vec![2, 0]);
        assert_eq!(kept_drafts(&[5, 6, 7, 1, 3], &drafts, &starts), vec![3, 0]);
        assert_eq!(kept_drafts(&[4, 6, 7, 1, 3], &drafts, &starts), vec![0, 0]);
        assert_eq!(kept_drafts(&[4], &[m], &[0, 1]), vec![0]);
    }
}
