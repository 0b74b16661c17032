//! The server's end of a trainer's weight-sync group (vLLM's NCCL weight transfer): join the
//! trainer's rendezvous store, read the NCCL id it published, open the NCCL communicator as
//! rank `rank_offset + server rank`, run the warm-up all-reduce every member runs, then receive
//! the announced tensors broadcast by rank 0 into host memory.
//!
//! Invariants: collectives run on a stream of their own on the engine's GPU, never on the
//! engine's stream (generation continues while weights arrive); what arrives is staged on the
//! host and only applied by the engine's update, so a transfer that fails half-way changed
//! nothing.

use std::time::Duration;

use candle_core::Device;

use super::InitInfo;
use super::packed::Announced;
use crate::engine::update::HostTensor;
use crate::error::{Error, Result};

#[cfg(feature = "nccl")]
mod imp {
    use std::sync::Arc;

    use candle_core::cuda_backend::cudarc::driver::CudaStream;
    use candle_core::cuda_backend::cudarc::nccl::safe::{Comm, Id, ReduceOp};

    use super::super::TRAINER_ID_KEY;
    use super::super::packed::{chunks, unpack};
    use super::super::pickle::nccl_id_from_pickle;
    use super::super::tcpstore::StoreClient;
    use super::*;

    fn fail(what: &str, e: impl std::fmt::Debug) -> Error {
        Error::WeightUpdate(format!("{what}: {e:?}"))
    }

    /// The communicator and its stream. SAFETY of Send: it is used by one thread at a time
    /// (the session holding it is behind a mutex), which NCCL allows.
    pub struct TrainerLink {
        comm: Comm,
        stream: Arc<CudaStream>,
        rank: usize,
        world: usize,
    }
    unsafe impl Send for TrainerLink {}

    impl TrainerLink {
        /// This server's rank in the group and the group's size.
        pub fn rank_and_world(&self) -> (usize, usize) {
            (self.rank, self.world)
        }

        /// Joins the group `info` describes as this server's rank 0, on `device`.
        pub fn join(info: &InitInfo, device: &Device, timeout: Duration) -> Result<Self> {
            let Device::Cuda(cuda) = device else {
                return Err(Error::WeightUpdate(
                    "weights arrive over NCCL on a CUDA engine only; this engine runs on the CPU"
                        .into(),
                ));
            };
            let rank = info.rank_offset;
            let mut store = StoreClient::connect(&info.master_address, info.master_port, timeout)?;
            store.join()?;
            let id = nccl_id_from_pickle(&store.get(TRAINER_ID_KEY)?)?;
            let mut internal = [0 as std::ffi::c_char; 128];
            for (d, b) in internal.iter_mut().zip(id) {
                *d = b as std::ffi::c_char;
            }
            let stream = cuda
                .cuda_stream()
                .context()
                .new_stream()
                .map_err(|e| fail("cannot create a stream", e))?;
            let comm = Comm::from_rank(stream.clone(), rank, info.world_size, Id::uninit(internal))
                .map_err(|e| fail("NCCL init with the trainer failed", e))?;
            // The warm-up all-reduce of one f32 every member of a vLLM group runs.
            let zero = stream.alloc_zeros::<f32>(1).map_err(|e| fail("alloc", e))?;
            let mut out = stream.alloc_zeros::<f32>(1).map_err(|e| fail("alloc", e))?;
            comm.all_reduce(&zero, &mut out, &ReduceOp::Sum)
                .map_err(|e| fail("NCCL warm-up all-reduce", e))?;
            stream.synchronize().map_err(|e| fail("sync", e))?;
            tracing::info!(rank, world = info.world_size, store = %format!("{}:{}", info.master_address, info.master_port), "joined the trainer's weight-sync group");
            Ok(Self {
                comm,
                stream,
                rank,
                world: info.world_size,
            })
        }

        /// Receives the broadcasts of `tensors` from the trainer (rank 0) into host memory.
        pub fn receive(
            &self,
            tensors: &[Announced],
            packed: bool,
            buffer_bytes: usize,
        ) -> Result<Vec<HostTensor>> {
            let mut out = Vec::with_capacity(tensors.len());
            for c in chunks(tensors, packed, buffer_bytes) {
                let mut buf = self
                    .stream
                    .alloc_zeros::<u8>(c.bytes)
                    .map_err(|e| fail("cannot allocate the receive buffer", e))?;
                self.comm
                    .broadcast(
                        None::<&candle_core::cuda_backend::cudarc::driver::CudaSlice<u8>>,
                        &mut buf,
                        0,
                    )
                    .map_err(|e| fail("NCCL broadcast from the trainer", e))?;
                let host = self
                    .stream
                    .clone_dtoh(&buf)
                    .map_err(|e| fail("copy to the host", e))?;
                out.extend(unpack(&host, &tensors[c.tensors])?);
            }
            Ok(out)
        }
    }
}

#[cfg(not(feature = "nccl"))]
mod imp {
    use super::*;

    /// Without the `nccl` feature there is no link: joining says how to get one.
    pub struct TrainerLink(());

    impl TrainerLink {
        /// This server's rank in the group and the group's size (no group: none).
        pub fn rank_and_world(&self) -> (usize, usize) {
            (0, 0)
        }

        /// Refused: this build has no NCCL.
        pub fn join(_info: &InitInfo, _device: &Device, _timeout: Duration) -> Result<Self> {
            Err(Error::WeightUpdate(
                "this build has no NCCL: weights pushed by a trainer need policy-serve built with `--features nccl` (and a CUDA engine); POST /v1/models/{key}/weights takes new weights from disk without it".into(),
            ))
        }

        /// Unreachable (no link can be made).
        pub fn receive(
            &self,
            _tensors: &[Announced],
            _packed: bool,
            _buffer_bytes: usize,
        ) -> Result<Vec<HostTensor>> {
            Err(Error::WeightUpdate("no NCCL link".into()))
        }
    }
}

pub use imp::TrainerLink;
