//! The runner room. `ModelRunner` loads one model (`ModelRunner::load`, `load.rs`: weights,
//! KV sizing, CUDA graphs, the tensor-parallel hello) and runs steps (`model_runner.rs`): it
//! owns the model, the KV tensors and the link to the workers; the scheduler hands it a batch
//! (tokens and `SeqInput`s) and gets logits back, then the ids drawn from them
//! (`ModelRunner::draw_ids` with each row's [`RowDraw`], `sampler.rs`), and the drafts a verify
//! step keeps (`accept.rs`). Also here: the graph buckets (`buckets.rs`),
//! the graphs (`graphs.rs`, CUDA), the KV cache's dtype and fp8 scales (`kv_scales.rs`) and the
//! loop ranks above 0 run (`worker.rs`).

pub mod accept;
pub mod buckets;
pub(crate) mod draft;
mod graph_greedy;
// The CPU build runs its tests; only the CUDA graphs use it.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod graph_rows;
#[cfg(feature = "cuda")]
pub mod graphs;
mod kv_scales;
mod load;
pub mod logprobs;
mod mask;
mod model_runner;
pub mod sampler;
pub mod worker;

pub use load::Loaded;
pub(crate) use model_runner::{GpuEvent, HostIds, ModelRunner};
pub use sampler::RowDraw;
