//! The parallel room: how the ranks of one model talk. `comm` holds the [`CommBackend`] trait,
//! the worker commands and the in-process backend (threads: CPU runs and tests); `nccl`
//! (feature `nccl`) the NCCL backend with a TCP link for commands; `transfer` a trainer's
//! weight-sync group (torch's rendezvous store, vLLM's packed NCCL broadcasts).
//!
//! Arrows point down only (into `crate::engine::batch` for the commands' sequences); the
//! model, the runner and the worker loop use this room, never the other way round.

pub mod comm;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod transfer;

pub use comm::{CommBackend, CommHandle, InProcessComm, RankSettings, WorkerCommand, agree};
