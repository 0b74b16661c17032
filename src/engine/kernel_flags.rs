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
    /// Blocks per SM of the streamed-rows 1-2-row gate|up matmuls
    /// (`KernelOptions::gemv_stream`; default 2).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=8))]
    pub gemv_stream: Option<u8>,
    /// The 1-2-row gate|up matmuls on a block per eight row pairs (turns
    /// `KernelOptions::gemv_stream` off).
    #[arg(long, conflicts_with = "gemv_stream")]
    pub no_gemv_stream: bool,
    /// The shared-memory carveout, in percent of the SM's L1 / shared memory, of the kernels
    /// of 1-2-row decode steps (`KernelOptions::smem_carveout`; default 100).
    #[arg(long, value_name = "PCT", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub smem_carveout: Option<u8>,
    /// The kernels of 1-2-row decode steps on the driver's carveout (turns
    /// `KernelOptions::smem_carveout` off).
    #[arg(long, conflicts_with = "smem_carveout")]
    pub no_smem_carveout: bool,
    /// The 1-row matmuls over more than 2,048 inputs (down) with their weights streamed into
    /// shared memory, N 2 KB pieces in flight a warp (`KernelOptions::gemv_tma`; 4 when no
    /// value is given; off by default).
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "4",
          value_parser = clap::value_parser!(u8).range(1..=10))]
    pub gemv_tma: Option<u8>,
    /// One batch of weight loads in flight in the 1-2-row matmuls over more than 2,048 inputs
    /// (turns `KernelOptions::gemv_double_buffer` off).
    #[arg(long)]
    pub no_gemv_double_buffer: bool,
    /// Two warps a row in the 1-2-row plain matmuls over more than 2,048 inputs
    /// (`KernelOptions::gemv_split_k`).
    #[arg(long)]
    pub gemv_split_k: bool,
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
            gemv_mma_plain: (!self.no_gemv_mma_plain).then(|| {
                self.gemv_mma_plain
                    .unwrap_or(super::options::GEMV_MMA_PLAIN_MAX_WEIGHT)
            }),
            gemv_stream: (!self.no_gemv_stream).then(|| {
                self.gemv_stream
                    .unwrap_or(super::options::GEMV_STREAM_BLOCKS)
            }),
            smem_carveout: (!self.no_smem_carveout)
                .then(|| self.smem_carveout.unwrap_or(super::options::SMEM_CARVEOUT)),
            gemv_tma: self.gemv_tma,
            gemv_double_buffer: !self.no_gemv_double_buffer,
            gemv_split_k: self.gemv_split_k,
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
mod tests {
    use clap::Parser;

    use crate::engine::flags::test_cli::Cli;
    use crate::engine::options::EngineOptions;

    fn opts(a: &[&str]) -> EngineOptions {
        Cli::parse_from(a).engine.options()
    }

    #[test]
    fn kernel_flags_become_kernel_options() {
        // The flags' defaults are `EngineOptions::default()`'s kernels.
        let d = opts(&["x"]);
        let lib = EngineOptions::default();
        assert_eq!(d.kernels, lib.kernels);
        let k = opts(&["x", "--no-gemv", "--no-graph-pdl"]);
        assert!(!k.kernels.gemv && !k.kernels.graph_pdl && k.kernels.pdl);
        assert!(k.kernels.mma_decode);
        assert_eq!(k.kernels.mma_decode_stages, None);
        let m = opts(&["x", "--no-mma-decode", "--mma-decode-stages", "3"]);
        assert!(!m.kernels.mma_decode && !m.kernels.mma_decode_split_p);
        assert_eq!(m.kernels.mma_decode_stages, Some(3));
        let p = opts(&["x", "--mma-decode-split-p"]);
        assert!(p.kernels.mma_decode && p.kernels.mma_decode_split_p);
        // The lean fused decode attention: on unless turned off.
        assert!(d.kernels.fused_lean && lib.kernels.fused_lean);
        let l = opts(&["x", "--no-fused-lean"]);
        assert!(!l.kernels.fused_lean);
        // The fused attention's tensor-core loop: one stage for steps of up to 2 rows unless
        // turned off; stages 1-2 only.
        let one = Some(crate::engine::options::FUSED_MMA_STAGES);
        assert_eq!((d.kernels.fused_mma, lib.kernels.fused_mma), (one, one));
        assert_eq!(
            d.kernels.fused_mma_rows,
            crate::engine::options::FUSED_MMA_ROWS
        );
        let f = opts(&["x", "--fused-mma", "2", "--fused-mma-rows", "1"]);
        assert_eq!(
            (f.kernels.fused_mma, f.kernels.fused_mma_rows),
            (Some(2), 1)
        );
        let n = opts(&["x", "--no-fused-mma"]);
        assert_eq!(n.kernels.fused_mma, None);
        assert!(Cli::try_parse_from(["x", "--fused-mma", "3"]).is_err());
        // Long contexts unfused: past 2,048 tokens (6,144 at one row) unless told otherwise.
        assert_eq!(
            (d.kernels.fused_long_ctx, d.kernels.fused_long_ctx_one),
            (Some(2048), Some(6144))
        );
        let u = opts(&["x", "--fused-long-ctx", "4096", "--fused-long-ctx-one", "9"]);
        assert_eq!(
            (u.kernels.fused_long_ctx, u.kernels.fused_long_ctx_one),
            (Some(4096), Some(9))
        );
        let o = opts(&["x", "--no-fused-long-ctx"]);
        assert_eq!(
            (o.kernels.fused_long_ctx, o.kernels.fused_long_ctx_one),
            (None, None)
        );
        assert_eq!(o.kernels.fused_long_ctx_many, None);
        assert_eq!(d.kernels.fused_long_ctx_many, Some(1024));
        let m = opts(&["x", "--fused-long-ctx-many", "3000"]);
        assert_eq!(m.kernels.fused_long_ctx_many, Some(3000));
        assert!(
            Cli::try_parse_from(["x", "--no-fused-long-ctx", "--fused-long-ctx", "1"]).is_err()
        );
        // The presummed norm: on unless turned off.
        assert!(d.kernels.norm_presum);
        let p = opts(&["x", "--no-norm-presum"]);
        assert!(!p.kernels.norm_presum);
        // The 1-row steps' own stages: two unless told otherwise; 1-2; not without the loop.
        assert_eq!(d.kernels.fused_mma_one, Some(2));
        let s = opts(&["x", "--fused-mma-one", "1"]);
        assert_eq!(s.kernels.fused_mma_one, Some(1));
        assert!(Cli::try_parse_from(["x", "--fused-mma-one", "3"]).is_err());
        assert!(Cli::try_parse_from(["x", "--fused-mma-one", "2", "--no-fused-mma"]).is_err());
        // The fused attention's row bound: 8 unless told otherwise; 0 and 17 refused.
        assert_eq!(d.kernels.fused_max_rows, 8);
        let r = opts(&["x", "--fused-max-rows", "8"]);
        assert_eq!(r.kernels.fused_max_rows, 8);
        assert!(Cli::try_parse_from(["x", "--fused-max-rows", "0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--fused-max-rows", "17"]).is_err());
        assert!(Cli::try_parse_from(["x", "--no-fused-mma", "--fused-mma", "2"]).is_err());
        // The unnormed tensor-core skinny matmuls: on for weights of up to 6Mi elements unless
        // turned off; --gemv-mma (every kind) takes them over.
        let max = Some(crate::engine::options::GEMV_MMA_PLAIN_MAX_WEIGHT);
        assert_eq!(
            (d.kernels.gemv_mma_plain, lib.kernels.gemv_mma_plain),
            (max, max)
        );
        let g = opts(&["x", "--gemv-mma-plain", "4096"]);
        assert_eq!(g.kernels.gemv_mma_plain, Some(4096));
        assert!(!g.kernels.gemv_mma);
        let n = opts(&["x", "--no-gemv-mma-plain"]);
        assert_eq!(n.kernels.gemv_mma_plain, None);
        assert!(
            Cli::try_parse_from(["x", "--no-gemv-mma-plain", "--gemv-mma-plain", "64"]).is_err()
        );
        // MoE kernel switches: one-pair tiles on and the norm+router launch off by default.
        assert!(d.kernels.moe_tile_one && !d.kernels.moe_norm_router);
        let e = opts(&["x", "--no-moe-tile-one", "--moe-norm-router"]);
        assert!(!e.kernels.moe_tile_one && e.kernels.moe_norm_router);
        assert!(d.kernels.moe_down_sum && e.kernels.moe_down_sum && lib.kernels.moe_down_sum);
        let s = opts(&["x", "--no-moe-down-sum"]);
        assert!(!s.kernels.moe_down_sum && s.kernels.moe_tile_one);
        // The LoRA overlap on unless turned off, the grouped shrinks off unless asked for,
        // each apart from the other.
        assert!(d.kernels.lora_overlap && !d.kernels.lora_grouped && lib.kernels.lora_overlap);
        assert!(!lib.kernels.lora_grouped);
        let f = opts(&["x", "--no-lora-overlap"]);
        assert!(!f.kernels.lora_overlap && !f.kernels.lora_grouped);
        let g = opts(&["x", "--lora-grouped"]);
        assert!(g.kernels.lora_grouped && g.kernels.lora_overlap);
        // The run shrink: on unless turned off, apart from the other two.
        assert!(d.kernels.lora_runs && lib.kernels.lora_runs && g.kernels.lora_runs);
        let r = opts(&["x", "--no-lora-runs"]);
        assert!(!r.kernels.lora_runs && r.kernels.lora_overlap && !r.kernels.lora_grouped);
        // The norm's loads before the wait: on unless turned off, apart from the others; the
        // second stream's row bound: 64 (none) unless set.
        assert!(d.kernels.lora_norm_preload && lib.kernels.lora_norm_preload);
        let n = opts(&["x", "--no-lora-norm-preload"]);
        assert!(!n.kernels.lora_norm_preload && n.kernels.lora_overlap && n.kernels.lora_runs);
        assert_eq!(
            (d.kernels.lora_side_min_rows, lib.kernels.lora_side_min_rows),
            (64, 64)
        );
        let m = opts(&["x", "--lora-side-min-rows", "16"]);
        assert_eq!(m.kernels.lora_side_min_rows, 16);
        assert!(m.kernels.lora_norm_preload);
        // The shrinks inside the base matmuls from 3 rows unless turned off or bounded.
        assert_eq!(
            (d.kernels.lora_wide, lib.kernels.lora_wide),
            (Some(3), Some(3))
        );
        let w = opts(&["x", "--no-lora-wide"]);
        assert_eq!(w.kernels.lora_wide, None);
        assert!(w.kernels.lora_overlap && w.kernels.lora_runs);
        let w = Cli::parse_from(["x", "--lora-wide-min-rows", "1"]);
        assert_eq!(w.engine.options().kernels.lora_wide, Some(1));
        assert!(Cli::try_parse_from(["x", "--no-lora-wide", "--lora-wide-min-rows", "8"]).is_err());
        // Host tier loads through a staging copy unless asked to read the slots directly.
        assert!(!d.kernels.kv_load_direct && !g.kernels.kv_load_direct);
        let k = opts(&["x", "--kv-load-direct"]);
        assert!(k.kernels.kv_load_direct);
        // The streamed gate|up (2 blocks an SM) and the double-buffered long rows by default,
        // the two-warps-a-row long rows off; each switched apart; a grid size with the switch
        // that turns streaming off is refused.
        assert_eq!(d.kernels.gemv_stream, Some(2));
        assert_eq!(lib.kernels.gemv_stream, d.kernels.gemv_stream);
        assert!(d.kernels.gemv_double_buffer && lib.kernels.gemv_double_buffer);
        assert!(!d.kernels.gemv_split_k && !lib.kernels.gemv_split_k);
        let n = opts(&["x", "--no-gemv-stream"]);
        assert_eq!(n.kernels.gemv_stream, None);
        assert!(n.kernels.gemv_double_buffer);
        let n = Cli::parse_from(["x", "--gemv-stream", "3", "--no-gemv-double-buffer"]);
        let n = n.engine.options();
        assert_eq!(n.kernels.gemv_stream, Some(3));
        assert!(!n.kernels.gemv_double_buffer && !n.kernels.gemv_split_k);
        assert!(Cli::try_parse_from(["x", "--gemv-stream", "2", "--no-gemv-stream"]).is_err());
        assert!(Cli::try_parse_from(["x", "--gemv-stream", "0"]).is_err());
        let n = opts(&["x", "--gemv-split-k"]);
        assert!(n.kernels.gemv_split_k && n.kernels.gemv_double_buffer);
        // The 1-2-row kernels' carveout: 100% unless told otherwise or off; 0-100 only.
        assert_eq!(d.kernels.smem_carveout, Some(100));
        assert_eq!(lib.kernels.smem_carveout, d.kernels.smem_carveout);
        assert_eq!(
            opts(&["x", "--smem-carveout", "75"]).kernels.smem_carveout,
            Some(75)
        );
        assert_eq!(
            opts(&["x", "--no-smem-carveout"]).kernels.smem_carveout,
            None
        );
        assert!(Cli::try_parse_from(["x", "--smem-carveout", "101"]).is_err());
        assert!(Cli::try_parse_from(["x", "--smem-carveout", "9", "--no-smem-carveout"]).is_err());
        // The streamed 1-row matmul: off unless asked for; 4 pieces a warp by default, 1-10.
        assert_eq!(d.kernels.gemv_tma, None);
        assert_eq!(opts(&["x", "--gemv-tma"]).kernels.gemv_tma, Some(4));
        assert_eq!(opts(&["x", "--gemv-tma", "8"]).kernels.gemv_tma, Some(8));
        assert!(Cli::try_parse_from(["x", "--gemv-tma", "11"]).is_err());
    }
}
