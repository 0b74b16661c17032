//! `--adapters N`: N random LoRA adapters (rank `--adapter-rank` on all seven projections, in
//! the model's real shapes), their load time, and decode rows with row i on adapter i % N.

use std::time::Instant;

use policy_serve::engine::ModelConfig;

use crate::Args;
use crate::rows::decode_rows;

/// Writes and loads `a.adapters` adapters (printing each load's time), then the decode rows
/// with every row on an adapter (`lora`), next to the base's rows printed before.
pub(crate) fn adapter_rows(
    engine: &policy_serve::Engine,
    a: &Args,
    cfg: &serde_json::Value,
) -> Result<(), Box<dyn std::error::Error>> {
    let mcfg = ModelConfig::from_json(&cfg.to_string())?;
    let root = std::env::temp_dir().join(format!("policy-serve-adapters-{}", std::process::id()));
    let mut handles = Vec::new();
    for i in 0..a.adapters {
        let dir = root.join(format!("a{i}"));
        policy_serve::testing::write_random_adapter(&dir, &mcfg, a.adapter_rank, 0.02)?;
        let t = Instant::now();
        handles.push(engine.load_adapter(&format!("a{i}"), &dir)?);
        println!(
            "lora adapter a{i} (rank {}, 7 projections) read+checked in {:.1} ms",
            a.adapter_rank,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    decode_rows(engine, a, "lora", &|r, i| {
        r.adapter = Some(handles[i % handles.len()].clone())
    })?;
    println!(
        "# adapter moves into device slots: {}",
        engine.stats().adapter_loads
    );
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}
