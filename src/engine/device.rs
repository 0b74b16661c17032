//! Device and dtype selection, and sizing the KV pool from a memory budget.

use candle_core::{DType, Device};

use super::defaults;
use crate::error::{Error, Result};

/// Where to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// CUDA device 0 if there is one, else the CPU (with a log line saying so).
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl DeviceChoice {
    /// Whether this choice runs on a GPU (`Auto`: whether CUDA is available).
    pub fn is_gpu(self) -> bool {
        match self {
            Self::Cpu => false,
            Self::Cuda(_) => true,
            Self::Auto => candle_core::utils::cuda_is_available(),
        }
    }
}

impl std::str::FromStr for DeviceChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            s => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| {
                    Error::InvalidInput(format!("device `{s}`: use auto, cpu, cuda or cuda:N"))
                }),
        }
    }
}

/// Compute dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DTypeChoice {
    /// The checkpoint's dtype on CUDA, f32 on the CPU.
    #[default]
    Auto,
    /// f32.
    F32,
    /// bf16.
    BF16,
    /// f16.
    F16,
}

impl std::str::FromStr for DTypeChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::BF16),
            "f16" | "float16" => Ok(Self::F16),
            s => Err(Error::InvalidInput(format!(
                "dtype `{s}`: use auto, f32, bf16 or f16"
            ))),
        }
    }
}

impl DTypeChoice {
    /// Resolves `Auto` for a device and a checkpoint dtype.
    pub fn resolve(self, device: &Device, checkpoint: Option<DType>) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::BF16 => DType::BF16,
            Self::F16 => DType::F16,
            Self::Auto if device.is_cpu() => DType::F32,
            Self::Auto => checkpoint.unwrap_or(DType::BF16),
        }
    }
}

/// Memory for the KV pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvBudget {
    /// On a GPU: this fraction of the device memory free after loading the weights.
    pub gpu_fraction: f64,
    /// On a GPU: this many GiB instead of the fraction, when set.
    pub gpu_gib: Option<f64>,
    /// On the CPU: this many GiB.
    pub cpu_gib: f64,
    /// If set, exactly this many blocks (tests, benchmarks).
    pub blocks: Option<usize>,
}

impl Default for KvBudget {
    fn default() -> Self {
        Self {
            gpu_fraction: defaults::GPU_MEMORY_UTILIZATION,
            gpu_gib: None,
            cpu_gib: defaults::CPU_KV_GIB,
            blocks: None,
        }
    }
}

impl KvBudget {
    /// Number of blocks of `block_bytes` the budget allows on `device`.
    pub fn blocks_for(&self, device: &Device, block_bytes: usize) -> Result<usize> {
        if let Some(b) = self.blocks {
            return Ok(b);
        }
        let gib = (1u64 << 30) as f64;
        let bytes = if device.is_cpu() {
            let want = self.cpu_gib * gib;
            // Checked before anything is allocated: an absurd budget is an error naming the
            // flag, never an allocation that aborts the process.
            if let Some(avail) = available_host_bytes()
                && want > avail as f64
            {
                return Err(Error::InvalidInput(format!(
                    "--kv-cache-gib {} asks for more KV memory than this host has available ({:.1} GiB); lower it",
                    self.cpu_gib,
                    avail as f64 / gib
                )));
            }
            want
        } else if let Some(g) = self.gpu_gib {
            let free = free_gpu_bytes(device)?;
            if g * gib > free as f64 {
                return Err(Error::InvalidInput(format!(
                    "--kv-cache-gib {g} asks for more KV memory than the GPU has free ({:.1} GiB after loading the weights); lower it",
                    free as f64 / gib
                )));
            }
            g * gib
        } else {
            free_gpu_bytes(device)? as f64 * self.gpu_fraction.clamp(0.0, 1.0)
        };
        Ok((bytes / block_bytes.max(1) as f64) as usize)
    }
}

/// The host memory available to new allocations (`MemAvailable` of `/proc/meminfo`; `None`
/// where it cannot be read).
fn available_host_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(feature = "cuda")]
fn free_gpu_bytes(device: &Device) -> Result<usize> {
    if !matches!(device, Device::Cuda(_)) {
        return Ok(0);
    }
    device.synchronize()?;
    let (free, _total) = candle_core::cuda_backend::cudarc::driver::result::mem_get_info()
        .map_err(|e| Error::Engine(format!("cannot read free GPU memory: {e:?}")))?;
    Ok(free)
}

#[cfg(not(feature = "cuda"))]
fn free_gpu_bytes(_device: &Device) -> Result<usize> {
    Ok(0)
}

/// Picks the device. On CUDA, cudarc's per-allocation event tracking is turned off: the
/// engine runs everything on the device's one stream, where stream order already orders every
/// use of a buffer, so the events only cost time (two event creations per allocation).
/// `event_tracking` keeps them (`KernelOptions::event_tracking`, to measure the difference).
pub fn select(choice: DeviceChoice, event_tracking: bool) -> Result<Device> {
    let device = pick(choice)?;
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = &device
        && !event_tracking
    {
        // SAFETY: the engine uses this device's one stream only (no second stream is created),
        // so no tensor is used on another stream before or after its allocation.
        unsafe { d.disable_event_tracking() };
    }
    let _ = event_tracking;
    Ok(device)
}

fn pick(choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda(i) => Device::new_cuda(i).map_err(|e| {
            Error::Engine(format!("CUDA device {i} is not usable ({e}); build with `--features cuda` on a machine with a GPU, or use --device cpu"))
        }),
        DeviceChoice::Auto => {
            if candle_core::utils::cuda_is_available()
                && let Ok(d) = Device::new_cuda(0)
            {
                return Ok(d);
            }
            tracing::info!("no CUDA device available (or built without the `cuda` feature); running on the CPU");
            Ok(Device::Cpu)
        }
    }
}

/// A short device name.
pub fn name(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        d => match d.location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
            other => format!("{other:?}").to_lowercase(),
        },
    }
}
