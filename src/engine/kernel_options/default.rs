//! The defaults of [`KernelOptions`] (every switch's value when nobody sets it; the figures
//! behind each are in the field's doc) and the reference set the kernels are checked against.

use super::*;

impl Default for KernelOptions {
    fn default() -> Self {
        Self {
            kernels: true,
            gemv: true,
            gemv_mma: false,
            gemv_mma_plain: Some(GEMV_MMA_PLAIN_MAX_WEIGHT),
            norm_presum: true,
            graph_argmax: true,
            graph_feed: true,
            gemv_stream: Some(GEMV_STREAM_BLOCKS),
            gemv_stream_stage: true,
            smem_carveout: Some(SMEM_CARVEOUT),
            gemv_tma: Some(GEMV_TMA_PIECES),
            gemv_tma_min_k: GEMV_TMA_MIN_K,
            gemv_tma_head: None,
            gemv_tma_head_argmax: true,
            gemv_double_buffer: true,
            gemv_split_k: false,
            weight_evict_first: true,
            gemv_x_shared: true,
            gemv_mma_x_stage: true,
            weight_evict_first_moe: false,
            l2_prefetch: false,
            sample_full: true,
            warp_norm: false,
            norm_deferred: Some(NORM_DEFERRED_MAX_K),
            fused_decode: true,
            clusters: true,
            gqa8_split: true,
            graph_splits_one: Some(GRAPH_SPLITS_ONE),
            graph_splits_few: Some(GRAPH_SPLITS_FEW),
            graph_splits_mid: Some(GRAPH_SPLITS_MID),
            fused_lean: true,
            fused_mma: Some(FUSED_MMA_STAGES),
            fused_mma_rows: FUSED_MMA_ROWS,
            fused_mma_one: Some(FUSED_MMA_ONE),
            fused_long_ctx: Some(FUSED_LONG_CTX),
            fused_long_ctx_one: Some(FUSED_LONG_CTX_ONE),
            fused_long_ctx_many: Some(FUSED_LONG_CTX_MANY),
            fused_max_rows: FUSED_ROWS,
            eager_graph_splits: true,
            blas_row_class: true,
            flash_prefill: true,
            wgmma_prefill: true,
            split_kv: true,
            pdl: true,
            graph_pdl: true,
            shared_kv_verify: false,
            mma_decode: true,
            mma_decode_stages: None,
            mma_decode_split_p: false,
            moe_tile_one: true,
            moe_norm_router: false,
            moe_down_sum: true,
            moe_route_one: true,
            moe_route_redux: true,
            moe_gate_up_cs: true,
            moe_rank_sort: true,
            lora_overlap: true,
            lora_grouped: false,
            lora_runs: true,
            lora_norm_preload: true,
            lora_side_min_rows: LORA_SIDE_MIN_ROWS,
            lora_wide: Some(LORA_WIDE_MIN_ROWS),
            kv_load_direct: false,
            event_tracking: false,
        }
    }
}

impl KernelOptions {
    /// The candle-op forward only (the reference the kernels are checked against).
    pub fn reference() -> Self {
        Self {
            kernels: false,
            ..Self::default()
        }
    }
}
