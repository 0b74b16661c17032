//! `GET /metrics`: Prometheus text: requests by route, errors, tokens by kind, open episodes,
//! and per loaded model the prefix-cache hit rate, queue depth and running sequences.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::state::AppState;

pub(super) async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let c = &st.counters;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in rows {
            out.push_str(&format!("{name}{labels} {v}\n"));
        }
    };
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    metric(
        "policy_serve_requests_total",
        "counter",
        "Requests by route.",
        vec![
            ("{route=\"chat_completions\"}".into(), get(&c.chat)),
            ("{route=\"completions\"}".into(), get(&c.completions)),
            ("{route=\"episode_act\"}".into(), get(&c.acts)),
        ],
    );
    metric(
        "policy_serve_request_errors_total",
        "counter",
        "Chat requests that failed.",
        vec![(String::new(), get(&c.errors))],
    );
    metric(
        "policy_serve_tokens_total",
        "counter",
        "Tokens by kind.",
        vec![
            ("{kind=\"prompt\"}".into(), get(&c.prompt_tokens)),
            ("{kind=\"completion\"}".into(), get(&c.completion_tokens)),
            ("{kind=\"cached_prompt\"}".into(), get(&c.cached_tokens)),
        ],
    );
    metric(
        "policy_serve_episodes_open",
        "gauge",
        "Open episodes.",
        vec![(String::new(), st.episodes.lock().len() as f64)],
    );
    let mut hit = vec![];
    let mut queue = vec![];
    let mut running = vec![];
    let (mut preempt, mut swaps) = (vec![], vec![]);
    let (mut drafted, mut kept) = (vec![], vec![]);
    let (mut verifies, mut paused) = (vec![], vec![]);
    let (mut adapters, mut moves) = (vec![], vec![]);
    // The KV tiers: (name, type, help, [(labels, value)]).
    type Rows = Vec<(String, f64)>;
    let mut tiers: Vec<(&str, &str, &str, Rows)> = vec![
        (
            "policy_serve_kv_tier_blocks",
            "gauge",
            "KV blocks held per tier (gpu: cached prefixes).",
            vec![],
        ),
        (
            "policy_serve_kv_tier_bytes",
            "gauge",
            "Bytes of KV blocks held below the GPU per tier.",
            vec![],
        ),
        (
            "policy_serve_kv_tier_loads_total",
            "counter",
            "KV blocks loaded back to the GPU per tier.",
            vec![],
        ),
        (
            "policy_serve_kv_tier_load_bytes_total",
            "counter",
            "Bytes of KV loaded back to the GPU.",
            vec![],
        ),
        (
            "policy_serve_kv_tier_recomputes_total",
            "counter",
            "KV blocks found below the GPU but recomputed (loading was slower).",
            vec![],
        ),
        (
            "policy_serve_kv_tier_checksum_failures_total",
            "counter",
            "Disk KV blocks that failed their checksum or were truncated (recomputed).",
            vec![],
        ),
        (
            "policy_serve_kv_tier_missing_total",
            "counter",
            "Disk KV blocks whose file was gone (recomputed).",
            vec![],
        ),
    ];
    for key in &st.offered {
        // Engine-level figures once per engine: an adapter key shares its base's.
        let adapter = st.registry.spec(key).is_ok_and(|s| s.adapter_of.is_some());
        if !adapter
            && st.registry.is_loaded(key)
            && let Ok(m) = st.registry.model(key)
        {
            let s = m.engine().stats();
            hit.push((format!("{{model=\"{key}\"}}"), s.cache_hit_rate));
            queue.push((format!("{{model=\"{key}\"}}"), s.waiting as f64));
            running.push((format!("{{model=\"{key}\"}}"), s.running as f64));
            preempt.push((format!("{{model=\"{key}\"}}"), s.preemptions as f64));
            swaps.push((format!("{{model=\"{key}\"}}"), s.swap_outs as f64));
            drafted.push((format!("{{model=\"{key}\"}}"), s.spec_draft_tokens as f64));
            kept.push((
                format!("{{model=\"{key}\"}}"),
                s.spec_accepted_tokens as f64,
            ));
            verifies.push((format!("{{model=\"{key}\"}}"), s.spec_verify_steps as f64));
            paused.push((format!("{{model=\"{key}\"}}"), s.spec_paused_steps as f64));
            adapters.push((format!("{{model=\"{key}\"}}"), s.adapters as f64));
            moves.push((format!("{{model=\"{key}\"}}"), s.adapter_loads as f64));
            if let Some(t) = s.kv_tiers {
                let l = |tier: &str| format!("{{model=\"{key}\",tier=\"{tier}\"}}");
                let m = format!("{{model=\"{key}\"}}");
                let rows: [Vec<(String, f64)>; 7] = [
                    vec![
                        (l("gpu"), s.cached_blocks as f64),
                        (l("host"), t.host_blocks as f64),
                        (l("disk"), t.disk_blocks as f64),
                    ],
                    vec![
                        (l("host"), t.host_bytes as f64),
                        (l("disk"), t.disk_bytes as f64),
                    ],
                    vec![
                        (l("host"), t.host_loads as f64),
                        (l("disk"), t.disk_loads as f64),
                    ],
                    vec![(m.clone(), t.load_bytes as f64)],
                    vec![(m.clone(), t.recomputes_chosen as f64)],
                    vec![(m.clone(), t.checksum_failures as f64)],
                    vec![(m, t.missing_blocks as f64)],
                ];
                for (row, m) in rows.into_iter().zip(tiers.iter_mut()) {
                    m.3.extend(row);
                }
            }
        }
    }
    metric(
        "policy_serve_cache_hit_rate",
        "gauge",
        "Prefix-cache hit rate (prompt tokens).",
        hit,
    );
    metric(
        "policy_serve_queue_depth",
        "gauge",
        "Requests waiting for admission.",
        queue,
    );
    metric(
        "policy_serve_running_sequences",
        "gauge",
        "Sequences decoding.",
        running,
    );
    metric(
        "policy_serve_preemptions_total",
        "counter",
        "Sequences preempted for lack of KV blocks (swapped out or recomputed).",
        preempt,
    );
    metric(
        "policy_serve_swap_outs_total",
        "counter",
        "Sequences swapped out to host memory.",
        swaps,
    );
    metric(
        "policy_serve_spec_draft_tokens_total",
        "counter",
        "Speculative decoding: draft tokens verified.",
        drafted,
    );
    metric(
        "policy_serve_spec_accepted_tokens_total",
        "counter",
        "Speculative decoding: drafts the model confirmed.",
        kept,
    );
    metric(
        "policy_serve_spec_verify_steps_total",
        "counter",
        "Speculative decoding: sequence-steps that verified drafts (mean accepted length = (accepted + verify steps) / verify steps).",
        verifies,
    );
    metric(
        "policy_serve_spec_paused_steps_total",
        "counter",
        "Speculative decoding: decode steps without drafts because the batch exceeded --speculative-max-batch.",
        paused,
    );
    metric(
        "policy_serve_lora_adapters",
        "gauge",
        "LoRA adapter versions registered with the engine (host copies).",
        adapters,
    );
    metric(
        "policy_serve_lora_adapter_loads_total",
        "counter",
        "LoRA adapters moved into a device slot.",
        moves,
    );
    for (name, kind, help, rows) in tiers {
        if !rows.is_empty() {
            metric(name, kind, help, rows);
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
