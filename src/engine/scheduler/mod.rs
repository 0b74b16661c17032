//! The scheduler room: the thread that runs continuous batching for one engine.
//!
//! One decode step, as data, from the scheduler through the runner and back:
//! 1. `core.rs`: the loop takes [`Command`]s, drops requests whose caller left, admits
//!    waiting ones (`memory.rs`: prefix-cache lookup, KV blocks, preemption by swap or
//!    recompute).
//! 2. `plan.rs`: `plan_step` turns the running `Seq`s into a `StepPlan` (which sequences,
//!    how many new tokens each, decode first); `run_plan` turns the plan into the runner's
//!    input: the tokens back to back and one `SeqInput` per sequence (`engine::batch`).
//! 3. The runner (`engine::runner`) runs the forward and returns logits; the scheduler takes
//!    each sampled row's uniform number from its request's generator (a `RowDraw`) and the
//!    runner draws the ids (`ModelRunner::draw_ids`).
//! 4. `output.rs`: `apply` updates each sequence from its id (tokens, stop strings, EOS, caps,
//!    streaming, detokenizing while the GPU runs the next step) and finishes the done ones.
//!
//! Speculative decoding (`speculate.rs`, off by default) gives eligible decode sequences
//! n-gram drafts that one step verifies.
//!
//! LoRA adapters (`adapters.rs`): registered host copies, the device slots they move into
//! (least recently used out first), each request's slot and prefix-cache namespace.
//!
//! Weight updates (`weights.rs`) pause admission, wait for (or end) the requests of the old
//! weights, write the new ones in place and drop the prefix cache.
//!
//! With pipelined decode (`pipeline.rs`) step 3's ids stay on the device and feed the next
//! step, which is launched before they are read (`seq::InFlight`).

mod adapter_table;
mod adapters;
mod core;
mod detok;
mod kv_tiers;
mod memory;
mod ngram;
mod output;
mod pipeline;
mod plan;
mod profile;
mod seq;
mod speculate;
mod weights;

pub(crate) use core::Scheduler;
pub(crate) use seq::Command;
