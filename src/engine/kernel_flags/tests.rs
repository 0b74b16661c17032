//! `KernelFlags` parsed as the CLI and the library see them: every switch's default and its
//! flags.

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
    assert!(Cli::try_parse_from(["x", "--no-fused-long-ctx", "--fused-long-ctx", "1"]).is_err());
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
    assert!(Cli::try_parse_from(["x", "--no-gemv-mma-plain", "--gemv-mma-plain", "64"]).is_err());
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
    // The 1-row gate|up's staged batch on by default, off by its switch alone.
    assert!(d.kernels.gemv_stream_stage && lib.kernels.gemv_stream_stage);
    let n = opts(&["x", "--no-gemv-stream-stage"]);
    assert!(!n.kernels.gemv_stream_stage && n.kernels.gemv_stream == Some(2));
    // The 1-2-row plain matmuls' input in shared memory: on in both defaults, off by its flag.
    assert!(d.kernels.gemv_x_shared && lib.kernels.gemv_x_shared);
    assert!(!opts(&["x", "--no-gemv-x-shared"]).kernels.gemv_x_shared);
    assert!(d.kernels.gemv_mma_x_stage && lib.kernels.gemv_mma_x_stage);
    assert!(
        !opts(&["x", "--no-gemv-mma-x-stage"])
            .kernels
            .gemv_mma_x_stage
    );
    assert!(n.kernels.gemv_double_buffer);
    let n = opts(&["x", "--gemv-split-k"]);
    assert!(n.kernels.gemv_split_k && n.kernels.gemv_double_buffer);
    assert!(d.kernels.weight_evict_first && lib.kernels.weight_evict_first);
    assert!(!d.kernels.weight_evict_first_moe && !lib.kernels.weight_evict_first_moe);
    assert!(
        !opts(&["x", "--no-weight-evict-first"])
            .kernels
            .weight_evict_first
    );
    assert!(
        opts(&["x", "--weight-evict-first-moe"])
            .kernels
            .weight_evict_first_moe
    );
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
    // The streamed 1-row matmul: on with 3 pieces a warp by default, 1-10, or off; from
    // 2,048 inputs unless told.
    assert_eq!(d.kernels.gemv_tma, Some(3));
    assert_eq!(opts(&["x", "--gemv-tma", "8"]).kernels.gemv_tma, Some(8));
    assert_eq!(opts(&["x", "--no-gemv-tma"]).kernels.gemv_tma, None);
    assert!(Cli::try_parse_from(["x", "--gemv-tma", "11"]).is_err());
    assert!(Cli::try_parse_from(["x", "--gemv-tma", "4", "--no-gemv-tma"]).is_err());
    assert_eq!(d.kernels.gemv_tma_min_k, 2048);
    let min_k = opts(&["x", "--gemv-tma-min-k", "2049"])
        .kernels
        .gemv_tma_min_k;
    assert_eq!(min_k, 2049);
    // The lm_head on cuBLAS unless told (the streamed head lost 2.5% at batch 1 on the
    // H200, round 69); --gemv-tma-head N turns it on, --no-gemv-tma-head names the default,
    // and the head rides on the streamed kernel, so --no-gemv-tma takes it off too. The
    // one-launch argmax stays on for where the head is turned on.
    assert_eq!(d.kernels.gemv_tma_head, None);
    assert!(d.kernels.gemv_tma_head_argmax);
    assert_eq!(opts(&["x", "--no-gemv-tma-head"]).kernels, d.kernels);
    assert_eq!(
        opts(&["x", "--gemv-tma-head", "4"]).kernels.gemv_tma_head,
        Some(4)
    );
    let off = opts(&["x", "--no-gemv-tma-head", "--no-gemv-tma-head-argmax"]).kernels;
    assert_eq!(off.gemv_tma_head, None);
    assert!(!off.gemv_tma_head_argmax);
    assert_eq!(opts(&["x", "--no-gemv-tma"]).kernels.gemv_tma_head, None);
    assert!(Cli::try_parse_from(["x", "--gemv-tma-head", "0"]).is_err());
    assert!(Cli::try_parse_from(["x", "--gemv-tma-head", "8", "--no-gemv-tma"]).is_err());
    assert!(Cli::try_parse_from(["x", "--gemv-tma-head", "8", "--no-gemv-tma-head"]).is_err());
    // The MoE gate|up's evict-first loads and the down + sum's ranked order: on.
    assert!(d.kernels.moe_gate_up_cs && d.kernels.moe_rank_sort);
    assert!(!opts(&["x", "--no-moe-gate-up-cs"]).kernels.moe_gate_up_cs);
    // The routing's picks by warp reductions: on.
    assert!(d.kernels.moe_route_redux);
    assert!(!opts(&["x", "--no-moe-route-redux"]).kernels.moe_route_redux);
    assert!(!opts(&["x", "--no-moe-rank-sort"]).kernels.moe_rank_sort);
    // The greedy tokens inside the graphs: on unless turned off.
    assert!(d.kernels.graph_argmax);
    assert!(!opts(&["x", "--no-graph-argmax"]).kernels.graph_argmax);
    // Their tokens also written into the graphs' input ids: on unless turned off.
    assert!(d.kernels.graph_feed && lib.kernels.graph_feed);
    assert!(!opts(&["x", "--no-graph-feed"]).kernels.graph_feed);
}
