//! The greedy tokens a decode graph computed with its logits (`KernelOptions::graph_argmax`)
//! and when a draw may take them: every row greedy, on those same logits, unedited. The
//! runner remembers them after a replay and forgets them at the next forward and when a mask
//! is written into the logits in place (a repetition penalty works on a copy, a tensor of
//! another id).

use candle_core::{Tensor, TensorId};
use parking_lot::Mutex;

use super::sampler::RowDraw;

/// The tokens of the last graph replay, with the id of the logits they were computed from.
#[derive(Debug, Default)]
pub(crate) struct GraphGreedy(Mutex<Option<(TensorId, Tensor)>>);

impl GraphGreedy {
    /// `ids` (u32 `[rows]`) are the greedy tokens of `logits` (`[rows, vocab]`), as they are
    /// now; None: there are none (forgets any before). Only graph replays remember (CUDA).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn remember(&self, logits: &Tensor, ids: Option<Tensor>) {
        *self.0.lock() = ids.map(|ids| (logits.id(), ids));
    }

    /// Forgets them (a new forward, or the logits edited in place).
    pub(crate) fn forget(&self) {
        *self.0.lock() = None;
    }

    /// The tokens, when every row of `draws` is greedy and `logits` are the tensor they were
    /// computed from.
    pub(crate) fn take_for(&self, logits: &Tensor, draws: &[RowDraw]) -> Option<Tensor> {
        let kept = self.0.lock();
        let (id, ids) = kept.as_ref()?;
        let greedy = draws.iter().all(|d| d.uniform.is_none());
        (greedy && *id == logits.id()).then(|| ids.clone())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::engine::request::SamplingParams;

    /// Mutations that fail it: taking the tokens for other logits of the same values (the id
    /// check dropped), for a step with a sampled row, after `forget`, or after `remember`
    /// with None.
    #[test]
    fn a_draw_takes_the_graph_tokens_only_for_their_own_unedited_greedy_logits() {
        let dev = Device::Cpu;
        let logits = Tensor::new(&[[0.1f32, 0.9, 0.3], [2.0, 1.0, 0.0]], &dev).unwrap();
        let tokens = Tensor::new(&[7u32, 9], &dev).unwrap();
        let greedy = RowDraw {
            params: SamplingParams::greedy(),
            uniform: None,
        };
        let sampled = RowDraw {
            params: SamplingParams {
                temperature: 1.0,
                ..SamplingParams::greedy()
            },
            uniform: Some(0.5),
        };
        let taken = |g: &GraphGreedy, l: &Tensor, d: &[RowDraw]| -> Option<Vec<u32>> {
            g.take_for(l, d).map(|t| t.to_vec1().unwrap())
        };
        let g = GraphGreedy::default();
        assert_eq!(taken(&g, &logits, &[greedy, greedy]), None, "none yet");
        g.remember(&logits, Some(tokens.clone()));
        assert_eq!(taken(&g, &logits, &[greedy, greedy]), Some(vec![7, 9]));
        // A copy of the same values is another tensor (a penalty works on one).
        assert_eq!(taken(&g, &logits.copy().unwrap(), &[greedy, greedy]), None);
        assert_eq!(
            taken(&g, &logits, &[greedy, sampled]),
            None,
            "a sampled row"
        );
        g.forget();
        assert_eq!(taken(&g, &logits, &[greedy, greedy]), None, "forgotten");
        g.remember(&logits, Some(tokens));
        g.remember(&logits, None);
        assert_eq!(
            taken(&g, &logits, &[greedy, greedy]),
            None,
            "none remembered"
        );
    }
}
