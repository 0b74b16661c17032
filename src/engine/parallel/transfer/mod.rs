//! Weights pushed by a trainer, as vLLM's NCCL weight transfer (what TRL's `VLLMClient`
//! drives): the trainer is rank 0 of a group it opens with a torch `TCPStore` rendezvous
//! (`tcpstore`), publishes the NCCL id there as a pickle (`pickle`), and broadcasts the
//! announced tensors packed in ~1 GiB `uint8` buffers (`packed`); `link` is the server's end.

pub mod link;
pub mod packed;
pub mod pickle;
pub mod tcpstore;

use serde::Deserialize;

pub use link::TrainerLink;
pub use packed::{Announced, Chunk, DEFAULT_BUFFER_BYTES, chunks, parse_update_info, unpack};
pub use pickle::nccl_id_from_pickle;
pub use tcpstore::StoreClient;

/// Where the trainer published the NCCL id (`StatelessProcessGroup.broadcast_obj`'s first
/// broadcast from rank 0).
pub const TRAINER_ID_KEY: &str = "broadcast_from/0/0";

/// vLLM's `init_info` of `POST /init_weight_transfer_engine`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct InitInfo {
    /// The trainer's address (its store listens there).
    pub master_address: String,
    /// The store's port.
    pub master_port: u16,
    /// The rank of the server's first GPU in the group (the trainer is rank 0).
    pub rank_offset: usize,
    /// Trainer ranks plus server ranks.
    pub world_size: usize,
    /// Tensors arrive packed (vLLM >= 0.28 says it here; older clients per update).
    #[serde(default)]
    pub packed: bool,
    /// The packed buffer size both ends use.
    #[serde(default = "default_buffer")]
    pub packed_buffer_size_bytes: usize,
    /// The model the weights are for (policy-serve's addition; default: the loaded one).
    #[serde(default)]
    pub model: Option<String>,
}

fn default_buffer() -> usize {
    DEFAULT_BUFFER_BYTES
}
