//! [`LaunchOptions`]: which launch paths the kernels take (the kernel half of the engine's
//! `KernelOptions`).

use crate::engine::options::KernelOptions;

/// Stages of the tensor-core decode attention over bf16 caches unless asked otherwise: 2 (3
/// takes 96 KB of shared memory a block, two blocks an SM, and was 5-16% slower on the H200).
pub const MMA_STAGES_BF16: u8 = 2;
/// Stages over fp8 caches: 3 (2 was 0-2% slower, 4 11-15% slower on the H200).
pub const MMA_STAGES_FP8: u8 = 3;

/// Which launch paths the kernels take where the hardware allows them (the kernel half of the
/// engine's `KernelOptions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Skinny-matmul kernels for 1-2 rows (bf16).
    pub gemv: bool,
    /// Tensor-core skinny-matmul kernels for 3-8 rows (bf16; with `gemv`; off: cuBLAS and
    /// the separate norm and SiLU kernels).
    pub gemv_mma: bool,
    /// The tensor-core skinny-matmul kernels without their fused norm (plain and SiLU) for
    /// 3-8 rows on weights of at most this many elements (with `gemv`; `gemv_mma` takes every
    /// kind).
    pub gemv_mma_plain: Option<usize>,
    /// The presummed norm for 3-8-row steps (`gemv_mma.cu` `mma_gemv_res_*`, `mma_gemv_pre_*`).
    pub norm_presum: bool,
    /// The greedy tokens computed with the f32 logits (`layer_ops.cu` `to_f32_argmax_*`),
    /// for the decode graphs.
    pub graph_argmax: bool,
    /// With `graph_argmax`, the graphs' argmax also writes the graph's input ids.
    pub graph_feed: bool,
    /// The 1-2-row gate|up matmuls on streamed rows, this many blocks per SM (`gemv.cu`
    /// `sgemv_silu_*`, `snorm_gemv_silu_*`; None: a block per eight row pairs; default 2).
    pub gemv_stream: Option<u8>,
    /// With `gemv_stream`, the 1-row gate|up copies each warp's second batch of weights into
    /// shared memory by cp.async before its wait where a warp has more than one batch (`_st`
    /// entries; the same bits; default on).
    pub gemv_stream_stage: bool,
    /// The shared-memory carveout (percent of the SM's unified L1 / shared memory, 0-100; the
    /// driver rounds up to a size the GPU has) the kernels of 1-2-row decode steps ask for
    /// (the skinny matmuls of `gemv.cu`, the fused attention's tensor-core kernels); None:
    /// the driver's choice a kernel.
    pub smem_carveout: Option<u8>,
    /// The 1-row plain matmuls of `gemv_tma_min_k`-4,096 inputs and 1,024 outputs on
    /// the streamed kernel (`kernels/gemv_tma_sm90.cu`), this many 2 KB pieces in flight a warp;
    /// None: gemv.cu's.
    pub gemv_tma: Option<u8>,
    /// Fewest inputs of the 1-row matmuls the streamed kernel takes.
    pub gemv_tma_min_k: usize,
    /// The streamed kernel takes weights of any row count, not only the 1,024-row ones it was
    /// measured faster on (`kernel_check`'s bit checks; the engine never sets it).
    pub gemv_tma_any_rows: bool,
    /// The lm_head of 1-row steps (more than 32,768 outputs, 1,024-4,096 inputs, a multiple
    /// of 1,024) on the streamed kernel too, this many 2 KB pieces in flight a warp; None:
    /// cuBLAS. Needs `gemv_tma`.
    pub gemv_tma_head: Option<u8>,
    /// A greedy 1-row decode graph's lm_head on the streamed kernel writes the f32 logits and
    /// takes their argmax in the same launch (`gemv_tma_argmax`), in place of the lm_head then
    /// `to_f32_argmax`. Needs `gemv_tma_head` and `graph_argmax`.
    pub gemv_tma_head_argmax: bool,
    /// Two batches of weight loads in flight in the 1-2-row plain and norm matmuls over more
    /// than 2,048 inputs (`gemv.cu` `gemv_db_*`).
    pub gemv_double_buffer: bool,
    /// Two warps a row (a half of K each) in the 1-2-row plain matmuls over more than 2,048
    /// inputs (`gemv.cu` `gemv_split_*`).
    pub gemv_split_k: bool,
    /// The skinny matmuls load their weights evict-first in L2 (`gemv_ef` / `gemv_mma_ef`).
    pub weight_evict_first: bool,
    /// With `weight_evict_first`, the 1-2-row plain matmuls copy their input into shared
    /// memory after their wait (`gemv_ef_xs`).
    pub gemv_x_shared: bool,
    /// With `weight_evict_first`, the 3-8-row tensor-core matmuls stage their input in shared
    /// memory by cp.async (`gemv_mma_ef_xs`).
    pub gemv_mma_x_stage: bool,
    /// Each skinny matmul of a decode step prefetches the next matmul's weights into L2
    /// while it runs (sm_90+).
    pub l2_prefetch: bool,
    /// Draw rows sampled over the whole vocabulary (no top-k, top-p off) on the device
    /// (`sample_full_f32`) instead of reading their logits to the host.
    pub sample_full: bool,
    /// The 1-2-row skinny matmuls behind a norm compute it per warp (no shared memory, no
    /// block barrier) instead of once per block.
    pub warp_norm: bool,
    /// The 1-2-row skinny matmuls behind a norm over at most this many inputs scale their
    /// sums by 1/rms instead of the inputs (`gemv.cu` `dnorm_*`, `sdnorm_*`; with `warp_norm`
    /// off).
    pub norm_deferred: Option<usize>,
    /// The fused decode attention (bf16).
    pub fused_decode: bool,
    /// Thread-block clusters in the fused decode attention (sm_90+).
    pub clusters: bool,
    /// GQA group 8 through the fused decode attention as two group-4 halves a KV head (which
    /// merge in clusters); off: group 8 unfused.
    pub gqa8_split: bool,
    /// The decode attention partitions of the 1-row graph bucket (None: 32).
    pub graph_splits_one: Option<usize>,
    /// The decode attention partitions of the 3-4-row graph buckets (None: 32; default 16).
    pub graph_splits_few: Option<usize>,
    /// The decode attention partitions of the 5-16-row graph buckets (None: 16; default 8).
    pub graph_splits_mid: Option<usize>,
    /// Eager decode steps cut the attention in at most their graph bucket's partitions.
    pub eager_graph_splits: bool,
    /// The fused decode attention's lean kernels (`decode_fused_lean_*`: the same bits with
    /// fewer instructions a token).
    pub fused_lean: bool,
    /// The fused decode attention's loop on tensor cores with this many K/V stages a warp (1
    /// or 2; `decode_fused_mma*`) for contexts that fit one cluster; None: the CUDA-core loop.
    pub fused_mma: Option<u8>,
    /// Most rows of a step whose fused decode attention takes the tensor-core loop.
    pub fused_mma_rows: usize,
    /// The tensor-core fused attention's stages for 1-row steps when they differ from
    /// `fused_mma`'s (1 or 2; None: `fused_mma`'s).
    pub fused_mma_one: Option<u8>,
    /// Decode steps of 2+ rows (5+: `fused_long_ctx_many`, where set) whose longest context
    /// passes this many tokens run the attention unfused (the tensor-core paged decode with `mma_decode`); None: fused at any
    /// context.
    pub fused_long_ctx: Option<usize>,
    /// The same bound for 1-row steps.
    pub fused_long_ctx_one: Option<usize>,
    /// The same bound for steps of 5+ rows; None: `fused_long_ctx`'s.
    pub fused_long_ctx_many: Option<usize>,
    /// Most rows of a decode step whose attention runs fused (at most `FUSED_MAX_ROWS`).
    pub fused_max_rows: usize,
    /// cuBLAS matmuls of up to 1,024 rows on the cuBLASLt algorithm of their row class.
    pub blas_row_class: bool,
    /// The flash prefill attention (bf16).
    pub flash_prefill: bool,
    /// The flash prefill on warpgroup MMA where the GPU has it (sm_90).
    pub wgmma_prefill: bool,
    /// Two warpgroup-MMA prefill blocks per SM (registers capped at 128 a thread) instead of
    /// one: 360 vs 284 TFLOP/s of attention at 32k on the H200 (BENCHMARKS.md).
    pub wgmma_prefill_x2: bool,
    /// Split the keys of a warpgroup-MMA prefill launch that would not fill the GPU (a short
    /// chunk over a long prefix) across blocks, merging their partial outputs.
    pub split_kv: bool,
    /// Programmatic dependent launch (sm_90+).
    pub pdl: bool,
    /// Verify steps of speculative decoding attend through the shared-K/V verify kernel
    /// (`paged_verify_g*`: one K/V load for up to 8 / G rows of a sequence) instead of one
    /// decode row at a time.
    pub shared_kv_verify: bool,
    /// Decode attention outside the fused kernel on tensor cores (`kernels/decode_mma.cu`;
    /// bf16 compute); off: the CUDA-core kernel (`kernels/decode.cu`).
    pub mma_decode: bool,
    /// Shared-memory stages of the tensor-core decode attention (2..=4; bf16 caches take at
    /// most 3); None: [`MMA_STAGES_BF16`] / [`MMA_STAGES_FP8`] by the cache's dtype.
    pub mma_decode_stages: Option<u8>,
    /// Over bf16 caches, P goes through the tensor-core decode attention as a bf16 pair (high
    /// part and remainder) instead of rounded to bf16.
    pub mma_decode_split_p: bool,
    /// MoE steps of up to 64 (token, expert) pairs on one-pair tiles (bf16); off: eight-
    /// and sixteen-pair tiles.
    pub moe_tile_one: bool,
    /// Before a sparse layer's router, the add+RMSNorm and the router's matmul in one launch
    /// for decode steps of 1-2 rows (bf16).
    pub moe_norm_router: bool,
    /// MoE steps on one-pair tiles run down and the experts' sum in one launch (bf16).
    pub moe_down_sum: bool,
    /// A one-token MoE step (at most 128 experts) routes and aligns by one warp
    /// (`moe_route_one_*`) instead of a block of 1,024 threads.
    pub moe_route_one: bool,
    /// The one-warp routing's picks by two warp reductions (`moe_route_one_rx_*`).
    pub moe_route_redux: bool,
    /// MoE steps on one-pair tiles load the experts' gate|up rows evict-first (bf16).
    pub moe_gate_up_cs: bool,
    /// The MoE down + sum launch orders each token's experts by one warp's ranks instead of
    /// one thread's insertion sort (the same order).
    pub moe_rank_sort: bool,
    /// LoRA steps of one-token tiles with each shrink before its base matmul (on a second
    /// stream beside it above `lora_side_min_rows` rows), the gate|up expand fused with the
    /// SiLU and the o/down expands with the next add+RMSNorm (`kernels/lora_silu.cu`).
    pub lora_overlap: bool,
    /// LoRA steps of 33-64 rows on one-token tiles read a slot's rows once per run of its
    /// tokens (`kernels/lora_grouped.cu`; bf16).
    pub lora_grouped: bool,
    /// The shrinks of LoRA steps of 17-64 rows on one-token tiles (at most 4,096 inputs) read
    /// the tile table, sorted by slot, by runs: a block takes eight tiles and its warps on one
    /// slot read the slot's rows of `a` once (`kernels/lora_runs.cu`).
    pub lora_runs: bool,
    /// The LoRA add+RMSNorm (`lora_overlap`) loads each thread's rows of `b` and its norm
    /// weights before the wait (`kernels/lora_silu.cu` `lora_add_rmsnorm_pre_*`).
    pub lora_norm_preload: bool,
    /// LoRA steps of more than this many rows run the overlap's shrinks on its second
    /// stream.
    pub lora_side_min_rows: usize,
    /// The wide-matmul LoRA kernels (`kernels/lora_silu.cu` `_w`, `lora_wide_expand`) serve
    /// steps of at least this many rows whose slots store `a` after the base weights.
    pub lora_wide: Option<usize>,
}

impl LaunchOptions {
    /// The launch paths the engine's `opts` ask for, as the kernels take them; `moe`: the
    /// model is a mixture of experts (its skinny matmuls' weights follow
    /// `weight_evict_first_moe`, not `weight_evict_first`). Two paths have no switch there:
    /// `gemv_tma_any_rows` (off: a check's own) and `wgmma_prefill_x2` (on).
    pub fn from_kernel_options(opts: &KernelOptions, moe: bool) -> Self {
        Self {
            gemv: opts.gemv,
            gemv_mma: opts.gemv_mma,
            gemv_mma_plain: opts.gemv_mma_plain,
            norm_presum: opts.norm_presum,
            graph_argmax: opts.graph_argmax,
            graph_feed: opts.graph_feed,
            gemv_stream: opts.gemv_stream,
            gemv_stream_stage: opts.gemv_stream_stage,
            smem_carveout: opts.smem_carveout,
            gemv_tma: opts.gemv_tma,
            gemv_tma_min_k: opts.gemv_tma_min_k,
            gemv_tma_any_rows: false,
            gemv_tma_head: opts.gemv_tma_head,
            gemv_tma_head_argmax: opts.gemv_tma_head_argmax,
            gemv_double_buffer: opts.gemv_double_buffer,
            gemv_split_k: opts.gemv_split_k,
            gemv_x_shared: opts.gemv_x_shared,
            gemv_mma_x_stage: opts.gemv_mma_x_stage,
            weight_evict_first: match moe {
                true => opts.weight_evict_first_moe,
                false => opts.weight_evict_first,
            },
            l2_prefetch: opts.l2_prefetch,
            warp_norm: opts.warp_norm,
            norm_deferred: opts.norm_deferred,
            sample_full: opts.sample_full,
            fused_decode: opts.fused_decode,
            clusters: opts.clusters,
            gqa8_split: opts.gqa8_split,
            graph_splits_one: opts.graph_splits_one,
            graph_splits_few: opts.graph_splits_few,
            graph_splits_mid: opts.graph_splits_mid,
            fused_lean: opts.fused_lean,
            fused_mma: opts.fused_mma,
            fused_mma_rows: opts.fused_mma_rows,
            fused_mma_one: opts.fused_mma_one,
            fused_long_ctx: opts.fused_long_ctx,
            fused_long_ctx_one: opts.fused_long_ctx_one,
            fused_long_ctx_many: opts.fused_long_ctx_many,
            fused_max_rows: opts.fused_max_rows,
            eager_graph_splits: opts.eager_graph_splits,
            blas_row_class: opts.blas_row_class,
            flash_prefill: opts.flash_prefill,
            wgmma_prefill: opts.wgmma_prefill,
            split_kv: opts.split_kv,
            pdl: opts.pdl,
            shared_kv_verify: opts.shared_kv_verify,
            mma_decode: opts.mma_decode,
            mma_decode_stages: opts.mma_decode_stages,
            mma_decode_split_p: opts.mma_decode_split_p,
            moe_tile_one: opts.moe_tile_one,
            moe_norm_router: opts.moe_norm_router,
            moe_down_sum: opts.moe_down_sum,
            moe_route_one: opts.moe_route_one,
            moe_route_redux: opts.moe_route_redux,
            moe_gate_up_cs: opts.moe_gate_up_cs,
            moe_rank_sort: opts.moe_rank_sort,
            lora_overlap: opts.lora_overlap,
            lora_grouped: opts.lora_grouped,
            lora_runs: opts.lora_runs,
            lora_norm_preload: opts.lora_norm_preload,
            lora_side_min_rows: opts.lora_side_min_rows,
            lora_wide: opts.lora_wide,
            wgmma_prefill_x2: true,
        }
    }
}

impl Default for LaunchOptions {
    /// `KernelOptions::default()`'s paths on a dense model, but without the greedy tokens
    /// inside the graphs (`graph_argmax`, `graph_feed`): the baseline `kernel_check` sets
    /// what it checks against.
    fn default() -> Self {
        Self {
            graph_argmax: false,
            graph_feed: false,
            ..Self::from_kernel_options(&KernelOptions::default(), false)
        }
    }
}
