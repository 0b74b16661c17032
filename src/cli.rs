//! The CLI's building blocks: engine flags shared by the subcommands, the echo environment
//! of `episode`, and the `.npy` writer of `logits`.

use std::path::Path;

use policy_serve::engine::{CommHandle, EngineFlags, spawn_in_process_workers};
use policy_serve::registry::resolve_files;
use policy_serve::{Action, EngineOptions, Error, ModelSource, Observation, Policy};

#[derive(clap::Args, Clone)]
pub struct EngineArgs {
    /// Device, dtype and engine sizing.
    #[command(flatten)]
    pub engine: EngineFlags,
    /// Tensor-parallel ranks (this process is rank 0). Without --rendezvous the other ranks
    /// run as threads of this process (in-process backend).
    #[arg(long, default_value_t = 1)]
    pub world_size: usize,
    /// HOST:PORT where rank 0 meets the `policy-serve worker` ranks (NCCL backend).
    #[arg(long)]
    pub rendezvous: Option<std::net::SocketAddr>,
    /// Seconds to wait for every rank to arrive at the rendezvous.
    #[arg(long, default_value_t = 300)]
    pub rendezvous_timeout: u64,
}

impl EngineArgs {
    /// Options plus, for `--world-size > 1`, the head's link to its workers.
    pub fn options_for(&self, key: &str, source: &ModelSource) -> Result<EngineOptions, Error> {
        let mut opts = self.options()?;
        if self.world_size <= 1 {
            return Ok(opts);
        }
        match self.rendezvous {
            None => {
                let files = resolve_files(key, source)?;
                let (head, workers) = spawn_in_process_workers(&files, self.world_size, &opts)?;
                drop(workers); // the worker threads end when the head shuts down
                opts.tensor_parallel = Some(head);
            }
            Some(addr) => opts.tensor_parallel = Some(self.nccl_link(0, addr)?),
        }
        Ok(opts)
    }

    #[cfg(feature = "nccl")]
    pub fn nccl_link(&self, rank: usize, addr: std::net::SocketAddr) -> Result<CommHandle, Error> {
        let device = policy_serve::engine::select_device(self.engine.device)?;
        let comm = policy_serve::engine::parallel::nccl::NcclComm::connect(
            rank,
            self.world_size,
            addr,
            &device,
            std::time::Duration::from_secs(self.rendezvous_timeout),
        )?;
        Ok(CommHandle(std::sync::Arc::new(comm)))
    }

    #[cfg(not(feature = "nccl"))]
    pub fn nccl_link(
        &self,
        _rank: usize,
        _addr: std::net::SocketAddr,
    ) -> Result<CommHandle, Error> {
        Err(Error::InvalidInput(
            "--rendezvous needs the NCCL backend: rebuild with `--features nccl` (or leave out --rendezvous to run the ranks as threads)".into(),
        ))
    }

    pub fn options(&self) -> Result<EngineOptions, Error> {
        Ok(self.engine.options())
    }
}

/// Steps a policy against the echo environment: each tool call is answered with its own
/// name and arguments; a finishing tool or a reply ends the episode.
pub fn run_episode(policy: &mut dyn Policy, task: String, max_steps: usize) -> Result<(), Error> {
    let mut observation: Observation = task.into();
    for i in 1..=max_steps {
        let step = policy.act(observation)?;
        let c = step.cost;
        let weights = match &c.weights_version {
            Some(v) => format!(", weights {}", serde_json::to_string(v)?),
            None => String::new(),
        };
        println!(
            "step {i}: {}  [prompt {} tok, cached {}, generated {}, {:.1} ms{weights}]",
            serde_json::to_string(&step.action)?,
            c.prompt_tokens,
            c.cached_prompt_tokens,
            c.generated_tokens,
            c.latency.as_secs_f64() * 1e3
        );
        observation = match &step.action {
            Action::Call { calls, .. } => {
                let results: Vec<String> = calls
                    .iter()
                    .map(|c| {
                        format!(
                            "echo: {}({})",
                            c.name,
                            serde_json::Value::Object(c.arguments.clone())
                        )
                    })
                    .collect();
                for r in &results {
                    println!("  tool -> {r}");
                }
                if calls.iter().any(|c| {
                    ["answer", "finish", "submit", "final", "done"]
                        .iter()
                        .any(|w| c.name.to_lowercase().contains(w))
                }) {
                    println!("episode finished: the policy called a finishing tool");
                    return Ok(());
                }
                Observation::ToolResults(results)
            }
            Action::Reply { .. } => {
                println!("episode finished: the policy replied");
                return Ok(());
            }
            Action::Invalid { error, .. } => {
                format!("Your last output was not a valid tool call: {error}").into()
            }
        };
    }
    println!("episode stopped after {max_steps} steps");
    Ok(())
}

/// Writes a 2-D f32 little-endian .npy (format version 1.0).
pub fn write_npy(path: &Path, rows: &[Vec<f32>]) -> Result<(), Error> {
    let cols = rows.first().map_or(0, Vec::len);
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
        rows.len(),
        cols
    );
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + rows.len() * cols * 4);
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for r in rows {
        for v in r {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    std::fs::write(path, bytes).map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))
}
