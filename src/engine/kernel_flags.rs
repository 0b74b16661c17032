//! `KernelFlags`: the command-line face of [`KernelOptions`] (all on by default unless a
//! variant is still being measured), flattened into `EngineFlags` and the bench's flags.

use super::options::KernelOptions;

/// The kernel switches as flags (all on by default), shared by `EngineFlags` and the bench.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct KernelFlags {
    /// Run the forward on candle ops instead of the engine's own CUDA kernels.
    #[arg(long)]
    pub no_kernels: bool,
    /// Use cuBLAS instead of the skinny-matmul kernels for decode steps of 1-2 rows.
    #[arg(long)]
    pub no_gemv: bool,
    /// Tensor-core skinny matmuls for decode steps of 3-8 rows (`KernelOptions::gemv_mma`).
    #[arg(long)]
    pub gemv_mma: bool,
    /// Tensor-core skinny matmuls without their fused norm for decode steps of 3-8 rows on
    /// weights of at most N elements, the norms apart (`KernelOptions::gemv_mma_plain`;
    /// default 6Mi).
    #[arg(long, value_name = "N")]
    pub gemv_mma_plain: Option<usize>,
    /// cuBLAS for every matmul of 3-8 rows (turns `KernelOptions::gemv_mma_plain` off).
    #[arg(long, conflicts_with = "gemv_mma_plain")]
    pub no_gemv_mma_plain: bool,
    /// The add+RMSNorm launch before qkv and gate|up in 3-8-row steps (turns
    /// `KernelOptions::norm_presum` off: o and down no longer add their output to the residual
    /// and sum its squares for the matmul after the norm).
    #[arg(long)]
    pub no_norm_presum: bool,
    /// Decode graphs leave the greedy tokens to an argmax after the graph instead of computing
    /// them with the f32 logits (turns `KernelOptions::graph_argmax` off).
    #[arg(long)]
    pub no_graph_argmax: bool,
    /// The decode graphs' argmax no longer writes the next pipelined step's input ids: the
    /// step copies them in front of its replay (turns `KernelOptions::graph_feed` off).
    #[arg(long)]
    pub no_graph_feed: bool,
    /// Blocks per SM of the streamed-rows 1-2-row gate|up matmuls
    /// (`KernelOptions::gemv_stream`; default 2).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=8))]
    pub gemv_stream: Option<u8>,
    /// The 1-2-row gate|up matmuls on a block per eight row pairs (turns
    /// `KernelOptions::gemv_stream` off).
    #[arg(long, conflicts_with = "gemv_stream")]
    pub no_gemv_stream: bool,
    /// The streamed 1-row gate|up loads each warp's second batch of weights after its wait
    /// instead of staging it in shared memory before (turns
    /// `KernelOptions::gemv_stream_stage` off).
    #[arg(long)]
    pub no_gemv_stream_stage: bool,
    /// The shared-memory carveout, in percent of the SM's L1 / shared memory, of the kernels
    /// of 1-2-row decode steps (`KernelOptions::smem_carveout`; default 100).
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub smem_carveout: Option<u8>,
    /// The kernels of 1-2-row decode steps on the driver's carveout (turns
    /// `KernelOptions::smem_carveout` off).
    #[arg(long, conflicts_with = "smem_carveout")]
    pub no_smem_carveout: bool,
    /// The 1-row matmuls of 2,048-4,096 inputs and 1,024 outputs (0.6B's o and down) with
    /// their weights streamed into shared memory, N 2 KB pieces in flight a warp
    /// (`KernelOptions::gemv_tma`; default 3).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=10))]
    pub gemv_tma: Option<u8>,
    /// Those 1-row matmuls on the skinny matmuls (turns `KernelOptions::gemv_tma` off).
    #[arg(long, conflicts_with = "gemv_tma")]
    pub no_gemv_tma: bool,
    /// Fewest inputs of the 1-row matmuls the streamed kernel takes
    /// (`KernelOptions::gemv_tma_min_k`; default 2,048; 2,049 leaves 0.6B's o out).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub gemv_tma_min_k: Option<u64>,
    /// The lm_head of 1-row steps on the streamed kernel too, N 2 KB pieces in flight a warp
    /// (turns `KernelOptions::gemv_tma_head` on; off by default: cuBLAS's head is 2.5% faster
    /// at batch 1 on the H200; 8 measured best on an H100).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u8).range(1..=10),
        conflicts_with = "no_gemv_tma"
    )]
    pub gemv_tma_head: Option<u8>,
    /// The lm_head of 1-row steps on cuBLAS (`KernelOptions::gemv_tma_head` off, and with it
    /// the one-launch argmax): the default since round 69, named so that commands written
    /// before still parse.
    #[arg(long, conflicts_with = "gemv_tma_head")]
    pub no_gemv_tma_head: bool,
    /// The greedy 1-row decode graphs' lm_head without the f32 logits and the greedy token
    /// in the same launch (turns `KernelOptions::gemv_tma_head_argmax` off: `to_f32_argmax`
    /// after the lm_head).
    #[arg(long)]
    pub no_gemv_tma_head_argmax: bool,
    /// One batch of weight loads in flight in the 1-2-row matmuls over more than 2,048 inputs
    /// (turns `KernelOptions::gemv_double_buffer` off).
    #[arg(long)]
    pub no_gemv_double_buffer: bool,
    /// Two warps a row in the 1-2-row plain matmuls over more than 2,048 inputs
    /// (`KernelOptions::gemv_split_k`).
    #[arg(long)]
    pub gemv_split_k: bool,
    /// Skinny matmuls of dense models load their weights as other loads (turns
    /// `KernelOptions::weight_evict_first` off).
    #[arg(long)]
    pub no_weight_evict_first: bool,
    /// The 1-2-row plain matmuls load their input chunk by chunk in their loop (turns
    /// `KernelOptions::gemv_x_shared` off).
    #[arg(long)]
    pub no_gemv_x_shared: bool,
    /// The 3-8-row tensor-core matmuls load their input step by step in their loop (turns
    /// `KernelOptions::gemv_mma_x_stage` off).
    #[arg(long)]
    pub no_gemv_mma_x_stage: bool,
    /// Skinny matmuls of MoE models load their weights evict-first in L2
    /// (`KernelOptions::weight_evict_first_moe`).
    #[arg(long)]
    pub weight_evict_first_moe: bool,
    /// Skinny matmuls prefetch the next matmul's weights into L2
    /// (`KernelOptions::l2_prefetch`).
    #[arg(long)]
    pub l2_prefetch: bool,
    /// Draw whole-vocabulary samples on the host (turns `KernelOptions::sample_full` off).
    #[arg(long)]
    pub no_device_full_sampling: bool,
    /// Per-warp fused norms in the 1-2-row skinny matmuls (`KernelOptions::warp_norm`).
    #[arg(long)]
    pub warp_norm: bool,
    /// The 1-2-row fused norms over at most K inputs scale the dot products, not the inputs
    /// (`KernelOptions::norm_deferred`; default 1,024).
    #[arg(long, value_name = "K", conflicts_with = "warp_norm")]
    pub norm_deferred_max_k: Option<usize>,
    /// Every 1-2-row fused norm scales its inputs (turns `KernelOptions::norm_deferred` off).
    #[arg(long, conflicts_with = "norm_deferred_max_k")]
    pub no_norm_deferred: bool,
    /// Run decode attention unfused (norm/RoPE/KV write, then attention).
    #[arg(long)]
    pub no_fused_decode: bool,
    /// No thread-block clusters in the fused decode attention.
    #[arg(long)]
    pub no_clusters: bool,
    /// GQA group 8 decode attention unfused (turns `KernelOptions::gqa8_split` off).
    #[arg(long)]
    pub no_gqa8_split: bool,
    /// Decode attention partitions of the 1-row graph bucket (`KernelOptions::graph_splits_one`;
    /// default 64, 32 as before).
    #[arg(long, value_name = "N")]
    pub graph_splits_one: Option<usize>,
    /// Decode attention partitions of the 3-4-row graph buckets (`KernelOptions::graph_splits_few`;
    /// default 16, 32 as before).
    #[arg(long, value_name = "N")]
    pub graph_splits_few: Option<usize>,
    /// Decode attention partitions of the 5-16-row graph buckets (`KernelOptions::graph_splits_mid`;
    /// default 8, 16 as before).
    #[arg(long, value_name = "N")]
    pub graph_splits_mid: Option<usize>,
    /// The fused decode attention's table index by an integer division instead of shift and
    /// mask (turns `KernelOptions::fused_lean` off).
    #[arg(long)]
    pub no_fused_lean: bool,
    /// The fused decode attention's loop on tensor cores with D stages a warp, 1 or 2
    /// (`KernelOptions::fused_mma`; default 1).
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u8).range(1..=2))]
    pub fused_mma: Option<u8>,
    /// The fused decode attention's loop on CUDA cores at every context (turns
    /// `KernelOptions::fused_mma` off).
    #[arg(long, conflicts_with = "fused_mma")]
    pub no_fused_mma: bool,
    /// Most rows of a step whose fused attention takes `--fused-mma`'s loop
    /// (`KernelOptions::fused_mma_rows`).
    #[arg(long, value_name = "N")]
    pub fused_mma_rows: Option<usize>,
    /// The stages of `--fused-mma`'s loop in 1-row steps, 1 or 2
    /// (`KernelOptions::fused_mma_one`; default 2).
    #[arg(long, value_name = "D", value_parser = clap::value_parser!(u8).range(1..=2), conflicts_with = "no_fused_mma")]
    pub fused_mma_one: Option<u8>,
    /// Decode steps of 2-4 rows (and 5+ without `--fused-long-ctx-many`'s own bound) whose
    /// longest context passes N tokens run the attention unfused
    /// (`KernelOptions::fused_long_ctx`; default 2,048).
    #[arg(long, value_name = "N")]
    pub fused_long_ctx: Option<usize>,
    /// The same for 1-row steps (`KernelOptions::fused_long_ctx_one`; default 6,144).
    #[arg(long, value_name = "N")]
    pub fused_long_ctx_one: Option<usize>,
    /// The same for steps of 5+ rows (`KernelOptions::fused_long_ctx_many`; default 1,024).
    #[arg(long, value_name = "N")]
    pub fused_long_ctx_many: Option<usize>,
    /// The fused attention at any context (the three bounds above off).
    #[arg(long, conflicts_with_all = ["fused_long_ctx", "fused_long_ctx_one", "fused_long_ctx_many"])]
    pub no_fused_long_ctx: bool,
    /// Decode steps of more than N rows run the attention unfused
    /// (`KernelOptions::fused_max_rows`, 1-16, 9-15 acting as 8; default 8).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16))]
    pub fused_max_rows: Option<u16>,
    /// Eager decode steps cut the attention in partitions of 32-128 tokens, as many as the
    /// context needs (turns `KernelOptions::eager_graph_splits` off).
    #[arg(long)]
    pub no_eager_graph_splits: bool,
    /// cuBLAS's own algorithm for each row count (turns `KernelOptions::blas_row_class` off).
    #[arg(long)]
    pub no_blas_row_class: bool,
    /// Prefill attention on the two-pass WMMA kernel instead of the flash prefill kernel.
    #[arg(long)]
    pub no_flash_prefill: bool,
    /// On Hopper, the mma.sync flash prefill instead of the warpgroup-MMA one.
    #[arg(long)]
    pub no_wgmma_prefill: bool,
    /// No split-KV prefill for short chunks over long prefixes (`KernelOptions::split_kv`).
    #[arg(long)]
    pub no_split_kv: bool,
    /// No programmatic dependent launch (eager steps and graphs).
    #[arg(long)]
    pub no_pdl: bool,
    /// No programmatic dependent launch inside captured CUDA graphs.
    #[arg(long)]
    pub no_graph_pdl: bool,
    /// Verify steps of speculative decoding through the shared-K/V verify attention
    /// (`KernelOptions::shared_kv_verify`).
    #[arg(long)]
    pub shared_kv_verify: bool,
    /// Decode attention on CUDA cores instead of tensor cores (turns
    /// `KernelOptions::mma_decode` off).
    #[arg(long)]
    pub no_mma_decode: bool,
    /// Shared-memory stages of the tensor-core decode attention (2-4, bf16 caches at most 3;
    /// `KernelOptions::mma_decode_stages`; default: 2 over bf16 caches, 3 over fp8).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(2..=4))]
    pub mma_decode_stages: Option<u8>,
    /// Over bf16 caches, the tensor-core decode attention's probabilities as a bf16 pair
    /// instead of rounded to bf16 (`KernelOptions::mma_decode_split_p`).
    #[arg(long)]
    pub mma_decode_split_p: bool,
    /// MoE steps of up to 64 pairs on the eight- and sixteen-pair expert tiles instead of
    /// one-pair tiles (turns `KernelOptions::moe_tile_one` off).
    #[arg(long)]
    pub no_moe_tile_one: bool,
    /// A sparse layer's add+RMSNorm and router matmul in one launch for decode steps of 1-2
    /// rows (`KernelOptions::moe_norm_router`).
    #[arg(long)]
    pub moe_norm_router: bool,
    /// MoE steps on one-pair tiles run the experts' down matmul and their sum in two
    /// launches (turns `KernelOptions::moe_down_sum` off).
    #[arg(long)]
    pub no_moe_down_sum: bool,
    /// One-token MoE steps route on a block of 1,024 threads (turns
    /// `KernelOptions::moe_route_one` off).
    #[arg(long)]
    pub no_moe_route_one: bool,
    /// The one-warp MoE routing picks by five shuffle rounds a pick (turns
    /// `KernelOptions::moe_route_redux` off).
    #[arg(long)]
    pub no_moe_route_redux: bool,
    /// MoE one-pair tiles load the experts' gate|up rows as other loads (turns
    /// `KernelOptions::moe_gate_up_cs` off).
    #[arg(long)]
    pub no_moe_gate_up_cs: bool,
    /// The MoE down + sum launch orders each token's experts by one thread's insertion sort
    /// (turns `KernelOptions::moe_rank_sort` off).
    #[arg(long)]
    pub no_moe_rank_sort: bool,
    /// LoRA steps launched one shrink and one expand per fused matmul, in order (turns
    /// `KernelOptions::lora_overlap` off: no second stream, no expands fused with the SiLU or
    /// the norms).
    #[arg(long)]
    pub no_lora_overlap: bool,
    /// LoRA steps of 33-64 rows shrink over at most 1,024 inputs on tensor cores, a group of
    /// tokens on one slot at a time (`KernelOptions::lora_grouped`).
    #[arg(long)]
    pub lora_grouped: bool,
    /// The shrinks of LoRA steps of 17-64 rows read adapter rows once per token, the table in
    /// row order (turns `KernelOptions::lora_runs` off).
    #[arg(long)]
    pub no_lora_runs: bool,
    /// The LoRA add+RMSNorm loads adapter rows and norm weights after its wait (turns
    /// `KernelOptions::lora_norm_preload` off).
    #[arg(long)]
    pub no_lora_norm_preload: bool,
    /// LoRA steps of more than this many rows run their shrinks on a second stream
    /// (`KernelOptions::lora_side_min_rows`; default 64: none).
    #[arg(long, value_name = "ROWS")]
    pub lora_side_min_rows: Option<usize>,
    /// LoRA shrinks in launches of their own, `a` in buffers apart from the base weights
    /// (turns `KernelOptions::lora_wide` off).
    #[arg(long)]
    pub no_lora_wide: bool,
    /// LoRA steps of at least this many rows shrink inside the base matmuls
    /// (`KernelOptions::lora_wide`; default 3).
    #[arg(long, value_name = "ROWS", conflicts_with = "no_lora_wide")]
    pub lora_wide_min_rows: Option<usize>,
    /// Host KV tier loads read pinned memory from the scatter kernel, no staging copy
    /// (`KernelOptions::kv_load_direct`).
    #[arg(long)]
    pub kv_load_direct: bool,
}

impl KernelFlags {
    /// The kernel options these flags describe.
    pub fn options(&self) -> KernelOptions {
        KernelOptions {
            kernels: !self.no_kernels,
            gemv: !self.no_gemv,
            gemv_mma: self.gemv_mma,
            norm_presum: !self.no_norm_presum,
            graph_argmax: !self.no_graph_argmax,
            graph_feed: !self.no_graph_feed,
            gemv_mma_plain: (!self.no_gemv_mma_plain).then(|| {
                self.gemv_mma_plain
                    .unwrap_or(super::options::GEMV_MMA_PLAIN_MAX_WEIGHT)
            }),
            gemv_stream: (!self.no_gemv_stream).then(|| {
                self.gemv_stream
                    .unwrap_or(super::options::GEMV_STREAM_BLOCKS)
            }),
            gemv_stream_stage: !self.no_gemv_stream_stage,
            smem_carveout: (!self.no_smem_carveout)
                .then(|| self.smem_carveout.unwrap_or(super::options::SMEM_CARVEOUT)),
            gemv_tma: (!self.no_gemv_tma)
                .then(|| self.gemv_tma.unwrap_or(super::options::GEMV_TMA_PIECES)),
            gemv_tma_min_k: self
                .gemv_tma_min_k
                .map_or(super::options::GEMV_TMA_MIN_K, |k| k as usize),
            gemv_tma_head: self.gemv_tma_head.filter(|_| !self.no_gemv_tma),
            gemv_tma_head_argmax: !self.no_gemv_tma_head_argmax,
            gemv_double_buffer: !self.no_gemv_double_buffer,
            gemv_split_k: self.gemv_split_k,
            weight_evict_first: !self.no_weight_evict_first,
            gemv_x_shared: !self.no_gemv_x_shared,
            gemv_mma_x_stage: !self.no_gemv_mma_x_stage,
            weight_evict_first_moe: self.weight_evict_first_moe,
            l2_prefetch: self.l2_prefetch,
            warp_norm: self.warp_norm,
            norm_deferred: (!self.no_norm_deferred).then(|| {
                self.norm_deferred_max_k
                    .unwrap_or(super::options::NORM_DEFERRED_MAX_K)
            }),
            sample_full: !self.no_device_full_sampling,
            fused_decode: !self.no_fused_decode,
            clusters: !self.no_clusters,
            gqa8_split: !self.no_gqa8_split,
            eager_graph_splits: !self.no_eager_graph_splits,
            fused_lean: !self.no_fused_lean,
            fused_mma: (!self.no_fused_mma)
                .then(|| self.fused_mma.unwrap_or(super::options::FUSED_MMA_STAGES)),
            fused_mma_rows: self
                .fused_mma_rows
                .unwrap_or(super::options::FUSED_MMA_ROWS),
            fused_mma_one: Some(self.fused_mma_one.unwrap_or(super::options::FUSED_MMA_ONE)),
            fused_long_ctx: (!self.no_fused_long_ctx).then(|| {
                self.fused_long_ctx
                    .unwrap_or(super::options::FUSED_LONG_CTX)
            }),
            fused_long_ctx_many: (!self.no_fused_long_ctx).then(|| {
                self.fused_long_ctx_many
                    .unwrap_or(super::options::FUSED_LONG_CTX_MANY)
            }),
            fused_long_ctx_one: (!self.no_fused_long_ctx).then(|| {
                self.fused_long_ctx_one
                    .unwrap_or(super::options::FUSED_LONG_CTX_ONE)
            }),
            fused_max_rows: self
                .fused_max_rows
                .map_or(super::options::FUSED_ROWS, usize::from),
            graph_splits_few: Some(
                self.graph_splits_few
                    .unwrap_or(super::options::GRAPH_SPLITS_FEW),
            ),
            graph_splits_mid: Some(
                self.graph_splits_mid
                    .unwrap_or(super::options::GRAPH_SPLITS_MID),
            ),
            graph_splits_one: Some(
                self.graph_splits_one
                    .unwrap_or(super::options::GRAPH_SPLITS_ONE),
            ),
            blas_row_class: !self.no_blas_row_class,
            flash_prefill: !self.no_flash_prefill,
            wgmma_prefill: !self.no_wgmma_prefill,
            split_kv: !self.no_split_kv,
            pdl: !self.no_pdl,
            graph_pdl: !self.no_graph_pdl,
            shared_kv_verify: self.shared_kv_verify,
            mma_decode: !self.no_mma_decode,
            mma_decode_stages: self.mma_decode_stages,
            mma_decode_split_p: self.mma_decode_split_p,
            moe_tile_one: !self.no_moe_tile_one,
            moe_norm_router: self.moe_norm_router,
            moe_down_sum: !self.no_moe_down_sum,
            moe_route_one: !self.no_moe_route_one,
            moe_route_redux: !self.no_moe_route_redux,
            moe_gate_up_cs: !self.no_moe_gate_up_cs,
            moe_rank_sort: !self.no_moe_rank_sort,
            lora_overlap: !self.no_lora_overlap,
            lora_grouped: self.lora_grouped,
            lora_runs: !self.no_lora_runs,
            lora_norm_preload: !self.no_lora_norm_preload,
            lora_side_min_rows: self
                .lora_side_min_rows
                .unwrap_or(super::options::LORA_SIDE_MIN_ROWS),
            lora_wide: (!self.no_lora_wide).then(|| {
                self.lora_wide_min_rows
                    .unwrap_or(super::options::LORA_WIDE_MIN_ROWS)
            }),
            kv_load_direct: self.kv_load_direct,
            ..KernelOptions::default()
        }
    }
}

#[cfg(test)]
mod tests;
