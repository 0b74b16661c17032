//! The HTTP host as a program: OpenAI-compatible chat completions with tools (and SSE
//! streaming), an episodes API for harnesses, health and Prometheus metrics. Everything is in
//! the library's `server` module; this parses the flags and serves.
//!
//!     cargo run --release --example serve                     # the demo on 127.0.0.1:8080
//!     cargo run --release --example serve -- --model-dir qwen3-0.6b=/models/Qwen3-0.6B --preload

use clap::Parser;
use policy_serve::server::{Config, serve};

#[tokio::main]
async fn main() {
    policy_serve::init_logging("info");
    if let Err(e) = serve(Config::parse()).await {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}
