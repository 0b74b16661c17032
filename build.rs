//! Builds the engine's own CUDA kernels (`kernels/*.cu`) when the `cuda` feature is on: nvcc
//! compiles each file to a fatbin holding machine code for sm_80 (A100) and sm_90 (H100/H200)
//! plus PTX for newer GPUs; the fatbins are embedded in the binary (`include_bytes!`) and
//! loaded from memory at run time, so a supported GPU runs them with no JIT. Files named
//! `*_sm90.cu` use Hopper-only instructions and hold sm_90a machine code only.

use std::path::{Path, PathBuf};
use std::process::Command;

const KERNELS: &[&str] = &[
    "decode",
    "decode_mma",
    "fused_decode",
    "prefill",
    "flash_prefill",
    "flash_prefill_sm90",
    "layer_ops",
    "kv_write",
    "logit_edits",
    "lora",
    "lora_silu",
    "lora_grouped",
    "lora_runs",
    "gemv",
    "gemv_mma",
    "kv_move",
    "moe",
    "moe_mma",
    "moe_route",
    "moe_router",
    "verify",
    "gemv_tma_sm90",
];

/// Second builds of a kernel file with macros defined: (fatbin name, source file, macros).
/// The skinny matmuls with their weights evict-first in L2 (`LaunchOptions::weight_evict_first`).
const VARIANTS: &[(&str, &str, &[&str])] = &[
    ("gemv_ef", "gemv", &["WEIGHT_EVICT_FIRST"]),
    ("gemv_mma_ef", "gemv_mma", &["WEIGHT_EVICT_FIRST"]),
    // And the 1-2-row plain matmuls' input copied into shared memory (`gemv_x_shared`).
    ("gemv_ef_xs", "gemv", &["WEIGHT_EVICT_FIRST", "X_SHARED"]),
    // And the 3-8-row tensor-core matmuls' input staged in shared memory (`gemv_mma_x_stage`).
    (
        "gemv_mma_ef_xs",
        "gemv_mma",
        &["WEIGHT_EVICT_FIRST", "MMA_X_STAGE"],
    ),
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for k in KERNELS {
        println!("cargo:rerun-if-changed=kernels/{k}.cu");
    }
    println!("cargo:rerun-if-changed=kernels/common.cuh");
    println!("cargo:rerun-if-changed=kernels/cluster.cuh");
    println!("cargo:rerun-if-changed=kernels/attention.cuh");
    println!("cargo:rerun-if-changed=kernels/flash.cuh");
    println!("cargo:rerun-if-changed=kernels/decode_mma.cuh");
    println!("cargo:rerun-if-changed=kernels/fused_parts.cuh");
    println!("cargo:rerun-if-changed=kernels/moe.cuh");
    println!("cargo:rerun-if-changed=kernels/lora.cuh");
    println!("cargo:rerun-if-changed=kernels/gemv.cuh");
    println!("cargo:rerun-if-changed=kernels/gemv_stream.cuh");
    println!("cargo:rerun-if-env-changed=CUDA_ROOT");
    println!("cargo:rerun-if-env-changed=NVCC");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let nvcc = find_nvcc().unwrap_or_else(|| {
        panic!(
            "the `cuda` feature needs nvcc from the CUDA 13.0 toolkit, and none was found \
             (looked at $NVCC, $CUDA_ROOT/bin/nvcc, $CUDA_PATH/bin/nvcc and PATH). Install it \
             with `bash ../shared/cuda/install-toolkit.sh && source ../shared/cuda/env.sh`, \
             or build without `--features cuda`."
        )
    });
    // The files compile concurrently, as many at once as cargo gives this build jobs (the
    // sm_90a flash prefill alone takes a quarter of the time).
    let jobs = std::env::var("NUM_JOBS")
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let mut pending: Vec<(&str, &str, &[&str])> = KERNELS
        .iter()
        .map(|&k| (k, k, &[][..]))
        .chain(VARIANTS.iter().copied())
        .collect();
    // Longest first: the Hopper flash prefill, then the rest in order.
    pending.sort_by_key(|(k, ..)| !k.ends_with("_sm90"));
    let mut running: Vec<(String, std::process::Child)> = Vec::new();
    while !pending.is_empty() || !running.is_empty() {
        while running.len() < jobs && !pending.is_empty() {
            let (k, src, defs) = pending.remove(0);
            let label = std::iter::once(format!("kernels/{src}.cu"))
                .chain(defs.iter().map(|d| format!("-D{d}")))
                .collect::<Vec<_>>()
                .join(" ");
            running.push((label, nvcc_command(&nvcc, (k, src, defs), &out)));
        }
        // Whichever finishes first frees its slot.
        let mut done = None;
        for (i, (k, child)) in running.iter_mut().enumerate() {
            if let Some(status) = child
                .try_wait()
                .unwrap_or_else(|e| panic!("cannot wait for nvcc on {k}: {e}"))
            {
                assert!(
                    status.success(),
                    "nvcc failed on {k} (see the errors above)"
                );
                done = Some(i);
                break;
            }
        }
        match done {
            Some(i) => drop(running.remove(i)),
            None => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// Starts nvcc on `kernels/{src}.cu` (with `-D{def}` for each of `defs`), writing
/// `{out}/{k}.fatbin`.
fn nvcc_command(
    nvcc: &Path,
    (k, src, defs): (&str, &str, &[&str]),
    out: &Path,
) -> std::process::Child {
    let src = Path::new("kernels").join(format!("{src}.cu"));
    let dst = out.join(format!("{k}.fatbin"));
    let mut cmd = Command::new(nvcc);
    cmd.args(["-O3", "-std=c++17", "-fatbin", "-lineinfo"]);
    for def in defs {
        cmd.arg(format!("-D{def}"));
    }
    // The `timeline` feature: every kernel records its blocks (kernels/common.cuh).
    if std::env::var_os("CARGO_FEATURE_TIMELINE").is_some() {
        cmd.arg("-DBLOCK_TIMELINE");
    }
    if k.ends_with("_sm90") {
        // Hopper-only instructions (wgmma): sm_90a machine code and nothing else; the host
        // loads these only on sm_90 GPUs.
        cmd.args(["-gencode", "arch=compute_90a,code=sm_90a"]);
    } else {
        cmd.args(["-gencode", "arch=compute_80,code=sm_80"])
            .args(["-gencode", "arch=compute_90,code=sm_90"])
            .args(["-gencode", "arch=compute_90,code=compute_90"]);
    }
    cmd.arg("-o")
        .arg(&dst)
        .arg(&src)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()))
}

fn find_nvcc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC") {
        return Some(p.into());
    }
    for var in ["CUDA_ROOT", "CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = std::env::var_os(var) {
            let p = Path::new(&root).join("bin/nvcc");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("nvcc"))
        .find(|p| p.is_file())
}
