//! The MoE kernels (`kernels/moe.cu`) against the candle-op experts on the same routing:
//! router logits given, routed on the host for the reference (softmax, top-k as HF), every
//! tile kind (narrow tiles of decode, the wide ones of prefill: tensor cores in bf16), one
//! rank's half of the experts (expert parallelism), both `norm_topk_prob` values.

use super::*;
use policy_serve::engine::model::moe::{experts_forward, route};

pub(super) fn checks(dev: &Device, t: &mut Table) -> Res<()> {
    let k = CudaKernels::new(dev, DType::BF16, &LaunchOptions::default())?.ok_or("no kernels")?;
    let kf = CudaKernels::new(dev, DType::F32, &LaunchOptions::default())?.ok_or("no kernels")?;
    // (tokens, experts, top-k, hidden, inter, first expert, local experts, norm)
    let cases = [
        (1, 128, 8, 2048, 768, 0, 128, true),
        (5, 128, 8, 2048, 768, 0, 128, false),
        (64, 128, 8, 2048, 768, 0, 128, true),
        (300, 128, 8, 2048, 768, 0, 128, true),
        (300, 128, 8, 2048, 768, 64, 64, true),
        (7, 8, 2, 256, 64, 4, 4, false),
        (600, 8, 2, 256, 64, 0, 8, true),
    ];
    for (tokens, e, top, hidden, inter, first, local, norm) in cases {
        for (dt, kk) in [(DType::BF16, &k), (DType::F32, &kf)] {
            let h = randn(&[tokens, hidden], dt, dev)?;
            let logits = randn(&[tokens, e], dt, dev)?;
            let gu = (randn(&[local, 2 * inter, hidden], dt, dev)? * 0.02)?;
            let dn = (randn(&[local, hidden, inter], dt, dev)? * 0.02)?;
            let ours = kk.moe_experts(&h, &logits, (&gu, &dn), (first, top, norm))?;
            let probs = candle_nn::ops::softmax_last_dim(&logits.to_dtype(DType::F32)?)?
                .to_vec2::<f32>()?;
            let mut routing = route(&probs, top, norm);
            // HF rounds the weights to the compute dtype (the kernels too).
            routing.weights = Tensor::new(routing.weights.as_slice(), dev)?
                .to_dtype(dt)?
                .to_dtype(DType::F32)?
                .to_vec1()?;
            let theirs = experts_forward(&h, (&gu, &dn), (first, top), &routing)?;
            let tol = if dt == DType::F32 { 1e-5 } else { 2e-2 };
            t.check(
                format!("moe {dt:?} T{tokens} E{e} top{top} h{hidden} i{inter} experts {first}+{local} norm {norm}"),
                rel(&ours, &theirs)?,
                tol,
            );
        }
    }
    Ok(())
}
