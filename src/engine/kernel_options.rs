//! The engine's kernel switches: [`KernelOptions`] (which of the engine's own CUDA kernels a
//! forward uses) and the defaults their fields take. Re-exported by `options`.

mod default;

/// The default of `KernelOptions::lora_side_min_rows`: no second stream (on the H200, 8
/// rank-16 adapters, against a bound of 8: +0.9-2.6% at batches 16-64; BENCHMARKS.md, #23).
pub const LORA_SIDE_MIN_ROWS: usize = 64;

/// The default of `KernelOptions::lora_wide`: LoRA steps of 3-64 rows (whose base matmuls
/// are cuBLAS's) shrink inside the base matmuls. On the H200, 8 rank-16 adapters, batches
/// 8-64: +2.0-7.0% (0.6B) / +0.3-5.7% (1.7B), 0.87-0.90 of the base; at 1-2 rows 0.6B gains
/// 6% / 2.5% but 1.7B loses 6% / 8% (BENCHMARKS.md, #23).
pub const LORA_WIDE_MIN_ROWS: usize = 3;

/// The default of `KernelOptions::norm_deferred`: on the H200, 0.6B (1,024 inputs) batch 1
/// +2.3%, 1.7B (2,048) batch 1 -2.2% (BENCHMARKS.md, #21).
pub const NORM_DEFERRED_MAX_K: usize = 1024;

/// The default of `KernelOptions::graph_splits_one`: on the H200, batch 1 at 8k / 32k tokens of
/// context 0.6B +23% / +51%, 1.7B +21% / +47% against 32; at 512 within 0.4% (BENCHMARKS.md,
/// #21).
pub const GRAPH_SPLITS_ONE: usize = 64;

/// The default of `KernelOptions::graph_splits_few`: on the H200, batches 3 / 4 against 32
/// partitions at 8k tokens of context 0.6B +12% / +9%, 1.7B +10% / +8%; at 32k +2-3%; at 512
/// within 0.3% (BENCHMARKS.md, #21).
pub const GRAPH_SPLITS_FEW: usize = 16;

/// The default of `KernelOptions::graph_splits_mid`: on the H200, batches 8 / 16 against 16
/// partitions at 8k tokens of context 0.6B +5.5% / +4.9%, 1.7B +4.9% / +3.7%; at 512 and 32k
/// within 0.4% (BENCHMARKS.md, #21).
pub const GRAPH_SPLITS_MID: usize = 8;

/// The default of `KernelOptions::gemv_mma_plain`: weights of up to 6Mi elements (12 MiB of
/// bf16), every matmul of a 0.6B layer and 1.7B's o (2,048 x 2,048). On the H200, 0.6B batch 8
/// after 512-token prompts 5,870-5,883 -> 6,655-6,720 tok/s, 1.7B +2%; on 1.7B's larger
/// weights the kernels lose against cuBLAS (all four on them: batch 8 4,097 -> 3,943)
/// (BENCHMARKS.md, #21).
pub const GEMV_MMA_PLAIN_MAX_WEIGHT: usize = 6 << 20;

/// Default most rows of a decode step whose fused attention runs its loop on tensor cores when
/// [`KernelOptions::fused_mma`] is on ([`KernelOptions::fused_mma_rows`]).
pub const FUSED_MMA_ROWS: usize = 2;

/// Default most rows of a decode step that runs the fused decode attention
/// ([`KernelOptions::fused_max_rows`]; the kernels serve at most 16): on the H200 the unfused
/// attention at batch 16 after 512-token prompts 0.6B +10%, 1.7B +7%; at batch 8 -3% / -2%
/// (BENCHMARKS.md, #21).
pub const FUSED_ROWS: usize = 8;

/// Default of [`KernelOptions::fused_long_ctx`]: steps of 2+ rows past 2,048 tokens of context
/// run the attention unfused. On the H200, 0.6B after 2k / 4k / 8k-token prompts: batch 2
/// +1% / +16% / +22%, batch 4 +2% / +10% / +20%, batch 8 +10% / +20% / +32%; 1.7B after 8k
/// batch 4 / 8 +14% / +26% (BENCHMARKS.md, #21).
pub const FUSED_LONG_CTX: usize = 2048;

/// Default of [`KernelOptions::fused_long_ctx_many`]: steps of 5+ rows past 1,024 tokens of
/// context run the attention unfused. On the H200, 0.6B after 1.2k-token prompts batch 5 / 6 /
/// 8 +12.8% / +12.7% / +5.3% against 2,048; after 700 (under it) unchanged (BENCHMARKS.md,
/// #21).
pub const FUSED_LONG_CTX_MANY: usize = 1024;

/// Default of [`KernelOptions::fused_long_ctx_one`]: 1-row steps past 6,144 tokens of context
/// run the attention unfused. On the H200, 0.6B batch 1 after 4k-token prompts -3%, after 8k
/// +5%, after 32k +24%; 1.7B after 8k +1% (BENCHMARKS.md, #21).
pub const FUSED_LONG_CTX_ONE: usize = 6144;

/// Default stages a warp of the fused attention's tensor-core loop ([`KernelOptions::fused_mma`]).
pub const FUSED_MMA_STAGES: u8 = 1;

/// Default stages of the fused attention's tensor-core loop in 1-row steps
/// ([`KernelOptions::fused_mma_one`]): two (on the H200 0.6B batch 1 after 512-token prompts
/// 1,257-1,276 against 1,242-1,244 tok/s; BENCHMARKS.md, #21).
pub const FUSED_MMA_ONE: u8 = 2;

/// Default shared-memory carveout of the kernels of 1-2-row decode steps
/// ([`KernelOptions::smem_carveout`]): 100% (the most shared memory; on the H200 batch 1 after
/// 512-token prompts +1-3% on 0.6B, +3% on 1.7B; after 2k-4k +3-4%; BENCHMARKS.md, #21).
pub const SMEM_CARVEOUT: u8 = 100;

/// Default pieces in flight a warp of the streamed 1-row matmul ([`KernelOptions::gemv_tma`]):
/// three (on the H200 0.6B batch 1 after 512-token prompts, its o and down on it: 1,369-1,371
/// tok/s at three, 1,351-1,354 at two, 1,347 at four, 1,309-1,310 at six; its bits equal the
/// skinny matmul's: BENCHMARKS.md, #21).
pub const GEMV_TMA_PIECES: u8 = 3;

/// Fewest inputs of the 1-row matmuls the streamed kernel takes by default
/// ([`KernelOptions::gemv_tma_min_k`]): 2,048, 0.6B's o as well as its down (on the H200 0.6B
/// batch 1 after 512-token prompts 1,346 against 1,306-1,307 tok/s with the down alone).
pub const GEMV_TMA_MIN_K: usize = 2048;

/// Blocks per SM of the streamed-rows gate|up matmuls by default (`KernelOptions::gemv_stream`;
/// 2 measured fastest of 1, 2 and 4 on the H200).
pub const GEMV_STREAM_BLOCKS: u8 = 2;

/// Which of the engine's own CUDA kernels a forward uses. Every switch is on by default and
/// only takes effect where the hardware and dtype allow it; turning one off runs the slower
/// path it replaces (for comparisons and debugging). Ignored without the `cuda` feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelOptions {
    /// The engine's own kernels at all (off: the forward runs candle ops, the reference path).
    pub kernels: bool,
    /// Skinny-matmul kernels for decode steps of 1-2 rows (bf16; off: cuBLAS).
    pub gemv: bool,
    /// Tensor-core skinny-matmul kernels, with their fused norms, for decode steps of 3-8
    /// rows (bf16, with `gemv`; off: cuBLAS and separate norm and SiLU kernels). Off by
    /// default: no faster than cuBLAS on the H200 (BENCHMARKS.md, #21).
    pub gemv_mma: bool,
    /// The tensor-core skinny-matmul kernels without their fused norm (the plain matmul and
    /// gate|up with SiLU, `kernels/gemv_mma.cu`) for decode steps of 3-8 rows on weights of
    /// at most this many elements (rows x inputs), the norms as separate launches (with
    /// `gemv`; `gemv_mma` takes every kind instead): such a step runs no split-K reduce after
    /// o and down and no SiLU launch after gate|up, which cuBLAS's small-tile kernels need.
    /// Default `Some(GEMV_MMA_PLAIN_MAX_WEIGHT)`; None: cuBLAS.
    pub gemv_mma_plain: Option<usize>,
    /// The presummed norm for decode steps of 3-8 rows (`kernels/gemv_mma.cu` `PS`): where
    /// `gemv_mma_plain` serves both the matmul before a norm (o, down) and the one after it
    /// (gate|up, the next layer's qkv), the first adds its output to the residual and writes
    /// the sum's squares summed over each block's columns, and the second normalizes its
    /// input rows as it loads them from those sums: no norm launch (two fewer launches a
    /// layer; not with LoRA rows, tensor parallelism or a trace). The input rounded as the
    /// deferred norm rounds it (bf16(h * w), the dot products times 1 / rms; against f32 math
    /// 2.99e-3 where the norm launch's path gives 3.16e-3). On by default: on the H200 0.6B
    /// after 512-token prompts batch 3 / 4 / 8 +3.0% / +3.6% / +2.2% (BENCHMARKS.md, #21; a
    /// first form that summed the partials before its loop lost 10% at batch 8); off: the
    /// norm launch.
    pub norm_presum: bool,
    /// Decode graphs compute each row's greedy token in the launch that writes the f32 logits
    /// (`kernels/layer_ops.cu` `to_f32_argmax_*`: each block's best, the row's last block
    /// merging them), and a step whose rows are all greedy and whose logits nothing edited
    /// takes those tokens instead of launching the argmax after the graph (two launches a
    /// step fewer). The same tokens: the best value's lowest index, whatever the parts. On by
    /// default: H200 batch 1 +0.4% on both shapes (BENCHMARKS.md, #21); off: the argmax after.
    pub graph_argmax: bool,
    /// With `graph_argmax`: the decode graphs' argmax also writes each row's greedy token
    /// into the graph's input ids, so a pipelined step fed with those tokens
    /// (`EngineOptions::pipelined_decode`) needs no device-to-device copy of them in front of
    /// its replay, and its upload leaves the ids alone (the same tokens in the same rows).
    /// On by default: H100 0.6B batches 1 / 8 +0.3% / +0.4% (BENCHMARKS.md round 52, #21);
    /// off: the ids copied in front of the replay.
    pub graph_feed: bool,
    /// The 1-2-row gate|up matmuls (with SiLU, alone or behind the fused norm) on streamed
    /// rows (`kernels/gemv.cu` `sgemv_silu_*`, their loops in `kernels/gemv_stream.cuh`): a
    /// grid of this many blocks per SM (1..=8), each warp taking every G-th pair, its weight
    /// loads in batches across pairs; bit for bit a block per eight pairs (None). Default
    /// `Some(GEMV_STREAM_BLOCKS)`: H200 batch 1 +6% (0.6B) / +4.5% (1.7B) (#21). 2-row steps
    /// over 1,024 or 2,048 inputs loop over whole rows (H100 batch 2 +4-5%).
    pub gemv_stream: Option<u8>,
    /// With [`KernelOptions::gemv_stream`], the 1-row gate|up copies each warp's second batch
    /// of weights into shared memory by cp.async before its wait and issues the third's loads
    /// before it sums the second: one round trip after the wait instead of two
    /// (`kernels/gemv.cu` `*_st_*`, 64 KB a block; only where a warp has more than one batch:
    /// 1.7B, not 0.6B; the same bits). On by default: H100 1.7B batch 1 after 512-token
    /// prompts 660-661 against 647-648 tok/s, batches 2 and 8 unchanged; H200 776-778 against
    /// 770 (BENCHMARKS.md rounds 59-60, #21).
    pub gemv_stream_stage: bool,
    /// The shared-memory carveout the kernels of 1-2-row decode steps ask for (the skinny
    /// matmuls of `gemv.cu` and the fused attention's tensor-core kernels; percent of the SM's
    /// unified L1 / shared memory, 0-100: `CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`).
    /// Left to the driver, the carveout follows each kernel's needs, so a 1-row step's
    /// kernels alternate between the matmuls' few KB and the attention's 84 KB a block, and an
    /// SM holds blocks of one carveout at a time. Default `Some(SMEM_CARVEOUT)` (100): on the
    /// H200 after 512-token prompts 0.6B batch 1 / 2 +1-3%, 1.7B +3% / +1%, 0.6B batch 1
    /// after 2k +4%; batch 8 and after 8k unchanged. The same carveout for every kernel of
    /// ours lost 21% at batch 8, whose kernels then had 28 KB of L1 (BENCHMARKS.md, #21).
    /// None: the driver's choice.
    pub smem_carveout: Option<u8>,
    /// The 1-row plain matmuls of `gemv_tma_min_k`-4,096 inputs (a multiple of 1,024) and
    /// 1,024 rows (0.6B's o and down) run on `kernels/gemv_tma_sm90.cu` (H100/H200): one
    /// block per SM, a copy warp streaming each compute warp's rows into a ring of this many
    /// 2 KB shared-memory pieces from before the wait on the kernel before; the same bits as
    /// the skinny matmuls (`kernel_check --gemv-only`). Default `Some(GEMV_TMA_PIECES)`;
    /// None: the skinny matmuls. Other weights take the skinny matmuls (on the H200 1.7B batch
    /// 1 lost 1.2% with its down on it, 2,048 x 6,144, and 1.1% with its o, 2,048 x 2,048; the
    /// 30B-A3B shape 2.2% with its router, 128 x 2,048).
    pub gemv_tma: Option<u8>,
    /// Fewest inputs of the 1-row plain matmuls [`KernelOptions::gemv_tma`] takes (a multiple
    /// of 1,024 from here up to 4,096). Default `GEMV_TMA_MIN_K` (2,048: 0.6B's o and down).
    pub gemv_tma_min_k: usize,
    /// The lm_head of 1-row steps (the vocabulary's rows over 1,024-4,096 inputs) on the
    /// streamed kernel of [`KernelOptions::gemv_tma`] too, this many 2 KB pieces in flight a
    /// warp (1-10), where cuBLAS reads it at ~4.2 TB/s on the H200 but waits for the kernel
    /// before to end (the streamed kernel copies its first pieces before its wait). Default
    /// None: cuBLAS, as without [`KernelOptions::gemv_tma`] (on the H200, the engine's card,
    /// 0.6B batch 1 after 512-token prompts 1,516-1,517 tok/s on cuBLAS against 1,473-1,484
    /// with `Some(8)` and [`KernelOptions::gemv_tma_head_argmax`], 1.7B 831-833 against
    /// 809-814, BENCHMARKS.md round 69; ten pieces measured like eight there, four and six 3%
    /// slower). Where it is turned on, give it eight: on an H100 0.6B batch 1 1,352-1,359
    /// tok/s at eight, 1,347-1,352 at ten, 1,328-1,332 at four, against 1,339-1,348 on
    /// cuBLAS; 1.7B +0.4-0.6% (round 64). Its sums are those of the skinny matmuls, not
    /// cuBLAS's: the logits may differ in the last bit.
    pub gemv_tma_head: Option<u8>,
    /// With [`KernelOptions::gemv_tma_head`] and [`KernelOptions::graph_argmax`], a greedy
    /// 1-row decode graph's lm_head launch also writes the f32 logits and takes the greedy
    /// token (the same logits and token as the lm_head, then `to_f32_argmax`): one launch of
    /// the head fewer (`kernel_check --gemv-only` holds both bit for bit, ties included).
    /// Default on (it acts only where [`KernelOptions::gemv_tma_head`] is turned on).
    pub gemv_tma_head_argmax: bool,
    /// The 1-2-row skinny matmuls over rows of more than 2,048 inputs (down; the plain and
    /// norm kernels) keep two batches of weight loads in flight instead of one (`gemv.cu`
    /// `gemv_db_*`, `norm_gemv_db_*`: the second issued before the wait too, each next one
    /// while the one before is summed; the same sums in the same order). On by default: on
    /// the H200 1.7B's down 10.5 -> 9.9 us alone, batch 2 +1-2% (BENCHMARKS.md, #21).
    pub gemv_double_buffer: bool,
    /// The 1-2-row plain matmuls over more than 2,048 inputs (down) run two warps a row, half
    /// of the inputs each (`gemv.cu` `gemv_split_*`). Off by default: on the H200 1.7B batch 1
    /// 641 against 669 tok/s, 0.6B within noise (BENCHMARKS.md, #21).
    pub gemv_split_k: bool,
    /// On dense models the skinny matmuls (`gemv.cu` 1-2 rows, `gemv_mma.cu` 3-8: qkv, o, the
    /// MLP, the head of small steps) load their weights evict-first in L2 (an L2 cache policy
    /// on each load; `build.rs` compiles both files again as `gemv_ef` / `gemv_mma_ef`; the
    /// same values, so the same outputs). A step reads each weight once; so marked, the weights
    /// streaming through L2 leave the lines other kernels read there. On by default: on the
    /// H200 after 512-token prompts 0.6B batch 8 +11.6% (7,712-7,728 against 6,898-6,949
    /// tok/s), 1.7B batch 8 +2.2%, batch 1 flat on both (#21).
    pub weight_evict_first: bool,
    /// With `weight_evict_first`, the 1-2-row plain matmuls (1.7B's o and down; 0.6B's at 2
    /// rows) copy their input into shared memory right after their wait, one round of loads,
    /// where their loop loaded it chunk by chunk, each load behind the chunk before (`build.rs`
    /// `gemv_ef_xs`; the same values). On by default: H200 after 512-token prompts 1.7B batch
    /// 1 / 2 +8% / +6.7%, 0.6B batch 2 +2.8% (BENCHMARKS.md round 61, #21).
    pub gemv_x_shared: bool,
    /// With `weight_evict_first`, the 3-8-row tensor-core matmuls without the block-wide
    /// norm copy each batch's input (and the presummed norm's weight) into their warp's part
    /// of a stage in shared memory by cp.async, one round of copies, where their loop loaded
    /// each step's input behind the step before (`build.rs` `gemv_mma_ef_xs`, up to 42 KB a
    /// block; the same values). On by default: H100 after 512-token prompts 0.6B batch 3 / 4
    /// / 8 +8.5% / +7% / +4.3%, 1.7B batch 8 (its o alone) +0.5% (BENCHMARKS.md round 62, #21).
    pub gemv_mma_x_stage: bool,
    /// `weight_evict_first` on MoE models (their attention's matmuls, the router, the head of
    /// small steps). Default off: on the H200 (30B-A3B shape, 8 layers) batch 1 -0.4%, 4 layers
    /// batches 1-8 within -0.5..+0.3%.
    pub weight_evict_first_moe: bool,
    /// Each skinny matmul of a decode step prefetches the next matmul's weights into L2 while
    /// it runs (sm_90+). Off by default: it loses 2-10% on the H200 (BENCHMARKS.md, #21).
    pub l2_prefetch: bool,
    /// Rows sampled over the whole vocabulary (no top-k, top-p 1: RL trainers' default) are
    /// drawn on the device (the inverse CDF in token-id order; the host walks it by
    /// probability, so the two draw different, equally distributed tokens for one seed).
    /// Off: their logits go to the host, 600 KB a row a step.
    pub sample_full: bool,
    /// The skinny matmuls of 1-2 rows compute their fused norm per warp (no shared memory, no
    /// block barrier) instead of once per block. Off by default: 16-24% slower (#21).
    pub warp_norm: bool,
    /// The 1-2-row fused norms over at most this many inputs scale the dot products by 1/rms,
    /// not every input (`kernels/gemv.cuh` `norm_rows_deferred`: one pass and one barrier, not
    /// two; the input rounded to bf16 once, at another scale; `warp_norm` takes precedence).
    /// Default `Some(NORM_DEFERRED_MAX_K)`; None: every norm scales its inputs.
    pub norm_deferred: Option<usize>,
    /// The fused decode attention (q/k norm + RoPE + KV write + attention + merge; bf16).
    pub fused_decode: bool,
    /// Merge fused decode attention in thread-block clusters (sm_90+).
    pub clusters: bool,
    /// cuBLAS matmuls of up to 1,024 rows take the cuBLASLt algorithm of their row class
    /// (`batch::row_class`), so a step and its graph bucket give each row the same bits.
    pub blas_row_class: bool,
    /// GQA group 8 (Qwen3-30B-A3B) decode steps of 1-2 rows through the fused attention as two
    /// group-4 halves a KV head (`kv_shift`; off: unfused). On: batch 1 +2.5% on the H200 (#29).
    pub gqa8_split: bool,
    /// The decode attention partitions of the 1-row CUDA-graph bucket (a multiple of 16;
    /// partitions past a context exit at once, and contexts of up to 2,048 tokens stay in one
    /// cluster of 16). None: 32, `batch::graph_splits`' count up to 4 rows, whose 256 blocks
    /// at 1 row (8 KV heads) are too few to keep the memory busy over a long context. Default
    /// `Some(GRAPH_SPLITS_ONE)` (64: 512 blocks, about one wave; 128 measured slower at 8k-32k).
    pub graph_splits_one: Option<usize>,
    /// The decode attention partitions of the 3- and 4-row CUDA-graph buckets (a power of two).
    /// Default `Some(GRAPH_SPLITS_FEW)` (16: 384-512 blocks of an 8-KV-head model, within one
    /// wave of ~660 at 96 registers a thread); None: 32 (768-1,024 blocks, past one wave).
    pub graph_splits_few: Option<usize>,
    /// The decode attention partitions of the 5- to 16-row CUDA-graph buckets (a power of two,
    /// at most 16). Default `Some(GRAPH_SPLITS_MID)` (8: 512 blocks at batch 8 of an
    /// 8-KV-head model); None: 16 (1,024 blocks at batch 8, past one wave).
    pub graph_splits_mid: Option<usize>,
    /// The fused decode attention with fewer instructions a token (`kernels/fused_decode.cu`
    /// `decode_fused_lean_*`): a power-of-two block size's table index and offset by shift
    /// and mask instead of an integer division (the K/V loads of a round issue sooner). The
    /// same sums in the same order: the same bits. On by default: on the H200 0.6B batch 8
    /// after 512-token prompts +2.1%, after 8k +8.4%, batch 1 +1-2.4%, 1.7B +1% (BENCHMARKS.md,
    /// #21); off: the division.
    pub fused_lean: bool,
    /// The fused decode attention's loop over a context that fits one cluster (up to 2,048
    /// tokens at 1-4 rows, 1,024 at 5-16) on tensor cores (`kernels/fused_decode.cu`
    /// `decode_fused_mma*`: the loop of `kernels/decode_mma.cu`, a warp taking chunks of 16
    /// tokens through this many stages of shared memory, 1 or 2, the first issued before the
    /// wait on the qkv matmul), in steps of at most [`KernelOptions::fused_mma_rows`] rows;
    /// longer contexts keep the CUDA-core loop (a half-warp a token). P is rounded to bf16 for
    /// the MMA as in the unfused tensor-core kernel, whose bits it gives at the same
    /// partitioning. Only steps whose contexts all fit one cluster take these kernels (eager
    /// steps by their contexts; the graphs of those buckets are captured twice and replayed by
    /// the longest context), so longer contexts run the CUDA-core kernels as before. Default
    /// `Some(FUSED_MMA_STAGES)` (1: four blocks an SM): on the H200 after 512-token prompts
    /// 0.6B batch 1 / 2 1,160 / 1,908 -> 1,234 / 2,076 tok/s (+6% / +9%), after 2k 938 / 1,552
    /// -> 1,039 / 1,678, 1.7B 692 / 1,111 -> 721 / 1,170; after 8k-32k unchanged (BENCHMARKS.md,
    /// #21). None: the CUDA-core loop everywhere.
    pub fused_mma: Option<u8>,
    /// Most rows of a decode step whose fused attention takes the tensor-core loop of
    /// `fused_mma` (larger steps keep the CUDA-core loop; rounded by `batch::bucket_bound`).
    /// Default `FUSED_MMA_ROWS` (2: on
    /// the H200 the loop lost 10-25% at batches 4-16 after 512-token prompts).
    pub fused_mma_rows: usize,
    /// The stages a warp of the tensor-core loop of `fused_mma` takes in 1-row steps (1 or 2),
    /// where they differ from `fused_mma`'s (which 2-row steps keep); the same bits at either.
    /// Default `Some(FUSED_MMA_ONE)` (2): on the H200, batch 1 after 512-token prompts, three
    /// interleaved runs against one stage: 0.6B 1,257-1,276 against 1,242-1,244 tok/s
    /// (+1.2-2.7%), after 2k equal (966 against 966-969), 1.7B 717-720 against 722-725 (-0.5%),
    /// batch 2 unchanged (BENCHMARKS.md, #21). None: `fused_mma`'s stages for both.
    pub fused_mma_one: Option<u8>,
    /// Decode steps of 2+ rows (5+: `fused_long_ctx_many`, where set) whose longest context
    /// passes this many tokens run the attention unfused (q/k norm + RoPE + KV write, the tensor-core paged decode of
    /// `mma_decode`, the merge: three launches a layer), eager steps by their contexts and
    /// graph replays on a second graph of each fused bucket captured unfused. Default
    /// `Some(FUSED_LONG_CTX)` (2,048: on the H200 0.6B batch 8 after 8k-token prompts 2,019 ->
    /// 2,672 tok/s, batch 16 2,317 -> 3,605; BENCHMARKS.md, #21); None: fused at any context.
    pub fused_long_ctx: Option<usize>,
    /// The same bound for 1-row steps. Default `Some(FUSED_LONG_CTX_ONE)` (6,144: on the H200
    /// 0.6B batch 1 after 32k-token prompts 389 -> 484 tok/s); None: fused at any context.
    pub fused_long_ctx_one: Option<usize>,
    /// The same bound for steps of 5+ rows; None: `fused_long_ctx`'s. Default
    /// `Some(FUSED_LONG_CTX_MANY)` (1,024: on the H200 0.6B batch 5 / 8 after 1.2k-token
    /// prompts +12.8% / +5.3%).
    pub fused_long_ctx_many: Option<usize>,
    /// Most rows of a decode step whose attention runs fused (at most 16, the kernels'
    /// bound); larger steps run it unfused (q/k norm + RoPE + KV write, the paged decode, the
    /// merge), eager steps and graph buckets alike (rounded by `batch::bucket_bound`: 9-15
    /// act as 8). Default `FUSED_ROWS` (8: on the H200 batch
    /// 16 after 512-token prompts 0.6B 8,643 -> 9,510 tok/s, 1.7B 6,556 -> 7,005;
    /// BENCHMARKS.md, #21).
    pub fused_max_rows: usize,
    /// Eager decode and verify steps (and a mixed step's decode rows) cut the attention in
    /// at most the partitions their graph bucket takes (`batch::graph_splits`), so an eager
    /// step and a graph replay cut a long context alike (the same bits); off: partitions of
    /// 32-128 tokens and, past 2,048 tokens, a merge of their cluster partials through global
    /// memory. On by default: on the H200, eager 0.6B decode at 8k tokens of context batch 1 /
    /// 4 540 -> 689 / 868 -> 1,268 tok/s, at 32k 212 -> 355 / 342 -> 582; graph steps and a
    /// mixed step unchanged (#21).
    pub eager_graph_splits: bool,
    /// The flash prefill attention (`kernels/flash_prefill.cu`: mma.sync tensor cores,
    /// cp.async double buffering, online softmax; bf16). Off: the two-pass WMMA kernel.
    pub flash_prefill: bool,
    /// On sm_90 GPUs, the flash prefill on warpgroup MMA (`kernels/flash_prefill_sm90.cu`);
    /// off: the mma.sync flash prefill there too.
    pub wgmma_prefill: bool,
    /// Split the keys of a prefill launch that would not give every SM a block (a short chunk
    /// over a long prefix) across blocks and merge their partial outputs (warpgroup-MMA
    /// kernel; a 512-token chunk over 32k: 153 -> 238 TFLOP/s on the H200).
    pub split_kv: bool,
    /// Programmatic dependent launch for eager launches (sm_90+).
    pub pdl: bool,
    /// Programmatic dependent launch inside captured CUDA graphs too (with `pdl`).
    pub graph_pdl: bool,
    /// Verify steps of speculative decoding attend through the shared-K/V verify kernel
    /// (`kernels/verify.cu` `paged_verify_g*`: a block loads each K/V row once for up to 8 / G
    /// rows of one sequence, causal within the draft) instead of one decode row at a time
    /// (GQA groups 1, 2, 4). Off by default: slower on the H200 (its dot products, not the K/V
    /// bytes L2 already serves, bound it: 0.6B batch 8 at K 4 15,202 against 19,187 tok/s;
    /// BENCHMARKS.md, #24).
    pub shared_kv_verify: bool,
    /// Decode attention of the steps the fused decode kernel does not take (more than 16
    /// sequences, verify rows) on tensor cores (`kernels/decode_mma.cu`: a warp takes 16
    /// tokens at a time, scores and the weighted sum as MMAs, the caches streamed through
    /// shared memory with cp.async; bf16 compute). Off: the CUDA-core kernel
    /// (`kernels/decode.cu`). On the H200 it reads bf16 caches at 3.2-4.2 TB/s against
    /// 2.7-3.5 and fp8 caches at 3.1-3.8 against 1.6-2.1 (0.6B batch 256: 39,868 -> 44,075
    /// tok/s with bf16 KV, 44,383 -> 61,362 with fp8; BENCHMARKS.md, #27).
    pub mma_decode: bool,
    /// Shared-memory stages each warp of the tensor-core decode attention streams its chunks
    /// of 16 tokens through (2..=4; bf16 caches take at most 3). None: the measured best for
    /// the cache's dtype (2 for bf16, 3 for fp8).
    pub mma_decode_stages: Option<u8>,
    /// Over bf16 caches, the tensor-core decode attention takes the probabilities as a bf16
    /// pair (high part and remainder, one more MMA a tile) instead of rounding them to bf16
    /// (2e-3 from f32 attention on the H200). Off by default: not yet measured (#27).
    pub mma_decode_split_p: bool,
    /// MoE steps of up to 64 (token, expert) pairs (eight tokens of a top-8 model) run their
    /// experts on one-pair tiles (bf16, CUDA cores: a third of the eight-pair tile's
    /// registers, so more warps in flight; the down kernel four rows a warp). Off: eight-pair
    /// tiles up to 16 pairs, then 16-pair tensor-core tiles. On the H200, one layer's experts
    /// of the 30B-A3B shape: 1 token 42 against 54 us, 8 tokens 162 against 197 (BENCHMARKS.md,
    /// #29).
    pub moe_tile_one: bool,
    /// Decode steps of 1-2 rows run a sparse layer's add+RMSNorm and router matmul as one
    /// launch (`moe_norm_router_t*`). Off by default: 1-2% slower on the H200 (#29).
    pub moe_norm_router: bool,
    /// MoE steps on one-pair tiles run the experts' down matmul and the sum over a token's
    /// experts in one launch (`kernels/moe.cu` `moe_down_sum_bf16`; the same bits as the two
    /// launches). On by default: on the H200 (30B-A3B shape) batch 1 +1.6% (#29).
    pub moe_down_sum: bool,
    /// One-token MoE steps (at most 128 experts) route and group their pairs by one warp
    /// (`moe_route_one_*`: the same ids, weights and tiles as the block of 1,024 threads). On by
    /// default: on the H200 (30B-A3B shape) batch 1 +1.2%, ~1.3 us a layer (#29).
    pub moe_route_one: bool,
    /// The one-warp routing picks each expert by two warp reductions (`redux.sync`) instead
    /// of five shuffle rounds (`moe_route_one_rx_*`; the same picks). On by default: on the
    /// H200 (30B-A3B shape, batch 1) +0.6% on 8 layers, +0.2% on 4; batches 2 and 8 flat.
    pub moe_route_redux: bool,
    /// MoE steps on one-pair tiles load the experts' gate|up rows evict-first
    /// (`moe_gate_up_t1_cs_bf16`; the same values). On by default: 30B-A3B shape batch 1 +1-2%.
    pub moe_gate_up_cs: bool,
    /// The MoE down + sum launch orders each token's experts by one warp's ranks instead of
    /// thread 0's insertion sort (`moe_down_sum_rk_bf16`; the same order, so the same sums).
    /// On by default: 30B-A3B shape batches 1 / 2 / 8 +1.7% / +2.2% / +5.1% on the H200.
    pub moe_rank_sort: bool,
    /// LoRA steps of up to 64 rows (one-token tiles) with four LoRA launches a layer instead
    /// of eight plus the SiLU: each shrink goes before the base matmul that reads the same
    /// input (on a second stream beside it above `lora_side_min_rows` rows), the gate|up
    /// expand is one launch with the SiLU product and the o and down expands one launch each
    /// with the add+RMSNorm after them (`kernels/lora_silu.cu`); the logits are the serial
    /// path's bit for bit (#23). On by default: on the H200 +1-4% at batches 8-64 over five
    /// runs, at batch 256 (where it does not apply) within the runs' noise (BENCHMARKS.md).
    pub lora_overlap: bool,
    /// LoRA steps of 33-64 rows (one-token tiles) shrink on tensor cores, a slot's rows of `a`
    /// read once per group of up to eight of its tokens (at most 1,024 inputs;
    /// `kernels/lora_grouped.cu`). Off by default: slower than `lora_runs` (BENCHMARKS.md).
    pub lora_grouped: bool,
    /// The shrinks of LoRA steps of 17-64 rows (one-token tiles, at most 4,096 inputs) read the
    /// tile table sorted by slot, by runs (`kernels/lora_runs.cu`): a slot's rows of `a` read
    /// once by the warps on it (one order of sums whatever the table's order). On: 8 rank-16
    /// adapters, batch 32 +3.0% (0.6B) / +2.6% (1.7B) on the H200 (#23).
    pub lora_runs: bool,
    /// The add+RMSNorm that takes the o and down expands (`lora_overlap`) loads each thread's
    /// rows of `b` and the norm weights before waiting on the kernel before it (bf16, ranks up
    /// to 16; the same bits, `kernels/lora_silu.cu`). On by default: on the H200, 8 rank-16
    /// adapters, +0.2-0.8% (0.6B) and +0.8-1.4% (1.7B) at batches 8-32 (BENCHMARKS.md, #23).
    pub lora_norm_preload: bool,
    /// With `lora_overlap`, LoRA steps of more than this many rows (at most 64) shrink on a
    /// second stream beside the base matmuls. Default 64 (none).
    pub lora_side_min_rows: usize,
    /// With `lora_overlap`, LoRA steps of at least this many rows (and at most 64) shrink
    /// inside the base matmuls: each fused weight is stored as `[out + slots·P·R, in]` (the
    /// slots' `a` after the base rows), one matmul writes the base output and every slot's `y`
    /// (rounded to the compute dtype, as PEFT rounds it), the expands read both at strides
    /// (`kernels/lora_silu.cu` `_w`). Default 3 rows; None: separate buffers.
    pub lora_wide: Option<usize>,
    /// The host KV tier's loads read the pinned host slots from the scatter kernel itself
    /// (`kernels/kv_move.cu` `kv_scatter_host`), no device staging copy a block. Off by
    /// default: no faster on the H200 (32k tokens: 155.2 against 156.1 ms; BENCHMARKS.md, #25).
    pub kv_load_direct: bool,
    /// Keep candle's per-tensor CUDA event tracking (off by default: the engine runs one
    /// stream, where the events only cost time).
    pub event_tracking: bool,
}
