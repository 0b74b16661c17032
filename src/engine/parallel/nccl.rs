//! NCCL backend (feature `nccl`): tensors move through NCCL collectives on the GPUs; commands
//! and acknowledgements through a TCP link from the head to each worker. Rank 0 creates the
//! NCCL id and hands it to the other ranks through a rendezvous at a given address.
//!
//! Invariants: the rendezvous and every command acknowledgement have timeouts (a rank that
//! never arrives, or dies, is a clear error, not a hang); collectives run only after the ranks
//! agreed on a step (see `scheduler::agree`). Keep `NCCL_NVLS_ENABLE=0` on multi-GPU machines.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop, sys,
};
use candle_core::cuda_backend::cudarc::nccl::safe::{Comm, Id, ReduceOp};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use parking_lot::Mutex;

use super::comm::{CommBackend, WorkerCommand};
use crate::error::{Error, Result};

/// A NCCL communicator. SAFETY of the Send/Sync impls: the communicator is only used behind
/// `Mutex`, so at most one thread issues NCCL calls on it at a time, which NCCL allows.
struct SharedComm(Mutex<Comm>);
unsafe impl Send for SharedComm {}
unsafe impl Sync for SharedComm {}

/// The NCCL backend of one rank.
pub struct NcclComm {
    rank: usize,
    world: usize,
    comm: Arc<SharedComm>,
    device: Device,
    /// Head: a stream per worker (index rank - 1). Worker: the stream to the head.
    links: Mutex<Vec<TcpStream>>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclComm(rank {} of {})", self.rank, self.world)
    }
}

fn io_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Engine(format!("{what}: {e}"))
}

/// One length-prefixed frame, written with a single `write_all` (with `TCP_NODELAY` set on
/// every link, a step's command and ack each cost one round trip, not a Nagle delay).
fn write_frame(s: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(4 + bytes.len());
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(bytes);
    s.write_all(&frame)?;
    s.flush()
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 256 << 20 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

impl NcclComm {
    /// Joins the group: rank 0 listens at `rendezvous` and waits for every other rank (up to
    /// `timeout`); the others connect to it (retrying until `timeout`). Then NCCL is set up on
    /// `device` (a CUDA device).
    pub fn connect(
        rank: usize,
        world: usize,
        rendezvous: SocketAddr,
        device: &Device,
        timeout: Duration,
    ) -> Result<Self> {
        let Device::Cuda(cuda) = device else {
            return Err(Error::InvalidInput(
                "the NCCL backend needs a CUDA device (--device cuda:N)".into(),
            ));
        };
        if world == 0 || rank >= world {
            return Err(Error::InvalidInput(format!(
                "rank {rank} of world size {world}: need 0 <= rank < world"
            )));
        }
        let deadline = Instant::now() + timeout;
        let (id, links) = if world == 1 {
            // A group of one (checks the NCCL path on a single GPU): no rendezvous.
            (
                Id::new().map_err(|e| io_err("cannot create the NCCL id", format!("{e:?}")))?,
                vec![],
            )
        } else if rank == 0 {
            let id =
                Id::new().map_err(|e| io_err("cannot create the NCCL id", format!("{e:?}")))?;
            let listener = TcpListener::bind(rendezvous)
                .map_err(|e| io_err(&format!("cannot listen at {rendezvous}"), e))?;
            listener
                .set_nonblocking(true)
                .map_err(|e| io_err("listener", e))?;
            let mut links: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
            while links.iter().any(Option::is_none) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).map_err(|e| io_err("link", e))?;
                        s.set_nodelay(true).map_err(|e| io_err("link", e))?;
                        s.set_read_timeout(Some(Duration::from_secs(30)))
                            .map_err(|e| io_err("link", e))?;
                        let hello = read_frame(&mut s).map_err(|e| io_err("rendezvous", e))?;
                        let r: usize =
                            serde_json::from_slice(&hello).map_err(|e| io_err("rendezvous", e))?;
                        if r == 0 || r >= world || links[r - 1].is_some() {
                            return Err(Error::Engine(format!("rendezvous: unexpected rank {r}")));
                        }
                        let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
                        write_frame(&mut s, &bytes).map_err(|e| io_err("rendezvous", e))?;
                        s.set_read_timeout(None).map_err(|e| io_err("link", e))?;
                        links[r - 1] = Some(s);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            let missing: Vec<String> = links
                                .iter()
                                .enumerate()
                                .filter(|(_, l)| l.is_none())
                                .map(|(i, _)| (i + 1).to_string())
                                .collect();
                            return Err(Error::Engine(format!(
                                "rank(s) {} never arrived at the rendezvous {rendezvous} within {timeout:?}; start them with `policy-serve worker --rank N --world-size {world} --rendezvous {rendezvous}`",
                                missing.join(", ")
                            )));
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => return Err(io_err("rendezvous accept", e)),
                }
            }
            (
                id,
                links.into_iter().map(|l| l.expect("all arrived")).collect(),
            )
        } else {
            let mut s = loop {
                match TcpStream::connect_timeout(&rendezvous, Duration::from_secs(2)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => {
                        return Err(io_err(
                            &format!("could not reach the head at {rendezvous} within {timeout:?}"),
                            e,
                        ));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            };
            s.set_nodelay(true).map_err(|e| io_err("link", e))?;
            write_frame(&mut s, &serde_json::to_vec(&rank)?)
                .map_err(|e| io_err("rendezvous", e))?;
            let bytes = read_frame(&mut s).map_err(|e| io_err("rendezvous", e))?;
            if bytes.len() != 128 {
                return Err(Error::Engine(format!(
                    "rendezvous: NCCL id of {} bytes, expected 128",
                    bytes.len()
                )));
            }
            let mut internal = [0 as std::ffi::c_char; 128];
            for (d, b) in internal.iter_mut().zip(&bytes) {
                *d = *b as std::ffi::c_char;
            }
            (Id::uninit(internal), vec![s])
        };
        let comm = Comm::from_rank(cuda.cuda_stream(), rank, world, id)
            .map_err(|e| io_err("NCCL init failed", format!("{e:?}")))?;
        tracing::info!(rank, world, %rendezvous, "NCCL group ready");
        Ok(Self {
            rank,
            world,
            comm: Arc::new(SharedComm(Mutex::new(comm))),
            device: device.clone(),
            links: Mutex::new(links),
        })
    }
}

/// All-reduce (sum) as a candle op on CUDA storage.
struct AllReduceSum(Arc<SharedComm>);

impl CustomOp1 for AllReduceSum {
    fn name(&self) -> &'static str {
        "nccl-all-reduce-sum"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("the NCCL all-reduce runs on CUDA tensors only")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let n = l.shape().elem_count();
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("the NCCL all-reduce needs a contiguous tensor")
        };
        let dev = s.device().clone();
        let comm = self.0.0.lock();
        macro_rules! reduce {
            ($t:ty) => {{
                let src = s.as_cuda_slice::<$t>()?.slice(start..end);
                // SAFETY: every element is written by the all-reduce before it is read.
                let mut dst = unsafe { dev.alloc::<$t>(n) }?;
                comm.all_reduce(&src, &mut dst, &ReduceOp::Sum)
                    .map_err(|e| candle_core::Error::msg(format!("NCCL all-reduce: {e:?}")))?;
                CudaStorage::wrap_cuda_slice(dst, dev.clone())
            }};
        }
        let out = match s.dtype() {
            DType::BF16 => reduce!(half::bf16),
            DType::F16 => reduce!(half::f16),
            DType::F32 => reduce!(f32),
            other => candle_core::bail!("NCCL all-reduce: unsupported dtype {other:?}"),
        };
        Ok((out, l.shape().clone()))
    }
}

/// A tensor's own device memory as the buffer of an in-place NCCL all-reduce: it allocates
/// nothing and records no event, so a stream capture holds the call as it is.
struct InPlace<T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _t: std::marker::PhantomData<T>,
}

impl<T> DeviceSlice<T> for InPlace<T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtrMut<T> for InPlace<T> {
    fn device_ptr_mut<'a>(&'a mut self, _: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        // Every launch of the step is on the one stream the NCCL communicator was made on,
        // so ordering needs no event.
        (self.ptr, SyncOnDrop::Record(None))
    }
}

/// All-gather along dim 0 as a candle op on CUDA storage.
struct AllGather0(Arc<SharedComm>, usize);

impl CustomOp1 for AllGather0 {
    fn name(&self) -> &'static str {
        "nccl-all-gather"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("the NCCL all-gather runs on CUDA tensors only")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let n = l.shape().elem_count();
        let Some((start, end)) = l.contiguous_offsets() else {
            candle_core::bail!("the NCCL all-gather needs a contiguous tensor")
        };
        let mut dims = l.shape().dims().to_vec();
        dims[0] *= self.1;
        let dev = s.device().clone();
        let comm = self.0.0.lock();
        macro_rules! gather {
            ($t:ty) => {{
                let src = s.as_cuda_slice::<$t>()?.slice(start..end);
                // SAFETY: the all-gather writes every element.
                let mut dst = unsafe { dev.alloc::<$t>(n * self.1) }?;
                comm.all_gather(&src, &mut dst)
                    .map_err(|e| candle_core::Error::msg(format!("NCCL all-gather: {e:?}")))?;
                CudaStorage::wrap_cuda_slice(dst, dev.clone())
            }};
        }
        let out = match s.dtype() {
            DType::BF16 => gather!(half::bf16),
            DType::F16 => gather!(half::f16),
            DType::F32 => gather!(f32),
            other => candle_core::bail!("NCCL all-gather: unsupported dtype {other:?}"),
        };
        Ok((out, Shape::from(dims)))
    }
}

impl CommBackend for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn send_command(
        &self,
        cmd: &WorkerCommand,
        timeout: Duration,
    ) -> Result<Vec<std::result::Result<(), String>>> {
        let bytes = serde_json::to_vec(cmd)?;
        let mut links = self.links.lock();
        for (i, s) in links.iter_mut().enumerate() {
            write_frame(s, &bytes)
                .map_err(|e| io_err(&format!("worker rank {} is gone", i + 1), e))?;
        }
        links
            .iter_mut()
            .enumerate()
            .map(|(i, s)| {
                s.set_read_timeout(Some(timeout))
                    .map_err(|e| io_err("link", e))?;
                let ack = read_frame(s).map_err(|e| {
                    io_err(
                        &format!("worker rank {} did not acknowledge (gone or stuck)", i + 1),
                        e,
                    )
                })?;
                Ok(serde_json::from_slice(&ack)?)
            })
            .collect()
    }

    fn recv_command(&self) -> Result<WorkerCommand> {
        let mut links = self.links.lock();
        let s = links
            .first_mut()
            .ok_or_else(|| Error::Engine("no link to the head".into()))?;
        let bytes = read_frame(s).map_err(|e| io_err("the link to the head is gone", e))?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    fn ack(&self, status: std::result::Result<(), String>) -> Result<()> {
        let mut links = self.links.lock();
        let s = links
            .first_mut()
            .ok_or_else(|| Error::Engine("no link to the head".into()))?;
        write_frame(s, &serde_json::to_vec(&status)?)
            .map_err(|e| io_err("the link to the head is gone", e))
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.contiguous()?
            .apply_op1_no_bwd(&AllReduceSum(self.comm.clone()))?)
    }

    fn all_reduce_sum_in_place(&self, t: &Tensor) -> Result<()> {
        let (storage, layout) = t.storage_and_layout();
        let candle_core::Storage::Cuda(s) = &*storage else {
            return Err(Error::Engine(
                "the NCCL all-reduce runs on CUDA tensors only".into(),
            ));
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            return Err(Error::Engine(
                "the NCCL all-reduce needs a contiguous tensor".into(),
            ));
        };
        let stream = s.device().cuda_stream();
        let comm = self.comm.0.lock();
        macro_rules! reduce {
            ($t:ty) => {{
                let view = s.as_cuda_slice::<$t>()?.slice(start..end);
                let (ptr, _read) = view.device_ptr(&stream);
                let mut buf = InPlace::<$t> {
                    ptr,
                    len: end - start,
                    stream: stream.clone(),
                    _t: std::marker::PhantomData,
                };
                comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum)
                    .map_err(|e| Error::Engine(format!("NCCL all-reduce: {e:?}")))?;
            }};
        }
        match t.dtype() {
            DType::BF16 => reduce!(half::bf16),
            DType::F16 => reduce!(half::f16),
            DType::F32 => reduce!(f32),
            other => {
                return Err(Error::Engine(format!(
                    "NCCL all-reduce: unsupported dtype {other:?}"
                )));
            }
        }
        Ok(())
    }

    fn all_gather(&self, t: &Tensor, dim: usize) -> Result<Tensor> {
        let front = t.transpose(0, dim)?.contiguous()?;
        let g = front.apply_op1_no_bwd(&AllGather0(self.comm.clone(), self.world))?;
        Ok(g.transpose(0, dim)?.contiguous()?)
    }

    fn barrier(&self) -> Result<()> {
        let one = Tensor::zeros(1, DType::F32, &self.device)?;
        self.all_reduce_sum(&one)?;
        self.device.synchronize()?;
        Ok(())
    }
}
