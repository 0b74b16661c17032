//! The step profile (`EngineOptions::profile_steps = Some(N)`): where a step's wall time goes on
//! the host, and on CUDA how long the GPU ran each step and sat idle between steps (from
//! events on the stream), summed over N steps, then logged (tracing target
//! `policy_serve::profile`).

use std::time::Duration;

use crate::engine::runner::GpuEvent;

/// Where a step's time goes, summed over `every` steps.
#[derive(Default)]
pub(super) struct StepProfile {
    every: u64,
    steps: u64,
    intake: Duration,
    step: Duration,
    pub(super) launch: Duration,
    pub(super) overlap: Duration,
    pub(super) sync: Duration,
    post: Duration,
    gpu_busy_ms: f64,
    gpu_idle_ms: f64,
    /// The event that ended the previous step's GPU work.
    last_end: Option<GpuEvent>,
}

impl StepProfile {
    /// A profile logged every `every` steps (`None` for 0).
    pub(super) fn every(every: u64) -> Option<Self> {
        (every > 0).then(|| Self {
            every,
            ..Self::default()
        })
    }

    /// One step's GPU span, from an event recorded before its first launch to one after its
    /// sampled tokens were read (both complete by then): the time since the previous step's
    /// end event is time the GPU had nothing to run.
    pub(super) fn gpu(&mut self, start: Option<GpuEvent>, end: Option<GpuEvent>) {
        let (Some(start), Some(end)) = (start, end) else {
            return;
        };
        self.gpu_busy_ms += end.ms_since(&start);
        if let Some(prev) = &self.last_end {
            self.gpu_idle_ms += start.ms_since(prev);
        }
        self.last_end = Some(end);
    }

    pub(super) fn record(
        &mut self,
        intake: Duration,
        step: Duration,
        post: Duration,
        running: usize,
    ) {
        self.intake += intake;
        self.step += step;
        self.post += post;
        self.steps += 1;
        if self.steps == self.every {
            let n = self.every as f64;
            let ms = |d: Duration| d.as_secs_f64() * 1e3 / n;
            tracing::info!(
                target: "policy_serve::profile",
                running,
                steps = self.every,
                intake_ms = ms(self.intake),
                step_ms = ms(self.step),
                forward_launch_ms = ms(self.launch),
                overlapped_output_ms = ms(self.overlap),
                sample_sync_ms = ms(self.sync),
                post_ms = ms(self.post),
                gpu_busy_ms = self.gpu_busy_ms / n,
                gpu_idle_ms = self.gpu_idle_ms / n,
                "step profile (ms per step)"
            );
            *self = Self {
                every: self.every,
                last_end: self.last_end.take(),
                ..Self::default()
            };
        }
    }
}
