//! The model room: everything about one rank's model and nothing about serving.
//!
//! - `config` (HF `config.json` / `generation_config.json`), `files` (the one list of a
//!   model's files, for local dirs and the hub alike), `weights` (safetensors checkpoints),
//!   `shard` (tensor-parallel slicing), `loader` (one rank's load);
//! - `qwen3` (structs with `load`/`forward`, like candle's model files), its `blocks`, its
//!   gather-path `attention` (planning + candle-op attention over paged KV) and `moe` (the
//!   sparse MLP of Qwen3-MoE: router, top-k, experts);
//! - `kernel_forward` (the same forward on the engine's own CUDA kernels, a type of its own)
//!   and `forward` ([`Model`]: the weights plus whichever forward runs them);
//! - `lora` (PEFT adapters read and checked), `lora_slots` (the adapters' device slots and
//!   the candle-op delta), `kernel_lora` (the delta on the kernels);
//! - `kv_cache` (the paged KV tensors); `update` (weights replaced in place, by HF name).
//!
//! Arrows point down only: into `crate::engine::batch`, `crate::engine::cuda` (the kernels'
//! launchers) and `crate::engine::parallel` (the all-reduce), never up into the runner or
//! the scheduler.

pub(crate) mod attention;
mod blocks;
pub mod config;
pub mod files;
pub mod forward;
#[cfg(feature = "cuda")]
mod kernel_attend;
#[cfg(feature = "cuda")]
mod kernel_buffers;
#[cfg(feature = "cuda")]
mod kernel_choice;
#[cfg(feature = "cuda")]
pub mod kernel_forward;
#[cfg(feature = "cuda")]
mod kernel_lora;
#[cfg(feature = "cuda")]
mod kernel_trace;
pub mod kv_cache;
#[cfg(feature = "cuda")]
pub mod kv_pinned;
#[cfg(feature = "cuda")]
mod kv_slabs;
pub mod loader;
pub mod lora;
pub mod lora_slots;
pub mod moe;
pub mod qwen3;
pub mod shard;
pub mod update;
pub mod weights;

pub use forward::Model;
