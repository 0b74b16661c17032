//! LoRA adapters on the scheduler thread: the adapters registered with the engine (host
//! copies, [`AdapterTable`]), which of them sit in the device's slots (least recently used
//! moves out first), and the requests' side: a request on an adapter is admitted once its
//! adapter is in a slot, and it keeps that slot until it leaves.
//!
//! Invariants: a slot is rewritten only when no running sequence uses it and no step is in
//! flight (admission runs with nothing in flight); a retired adapter takes no new request
//! (requests that name it move to the newest version under its name) and leaves the table
//! once no request uses it; a prefix computed under one adapter's content is cached in its
//! own namespace of the prefix cache, never found from another adapter or the base.

use std::sync::Arc;

use super::adapter_table::{Registered, namespace};
use super::core::Scheduler;
use super::seq::Seq;
use crate::engine::handle::Replier;
use crate::engine::model::lora_slots::SlotImage;
use crate::engine::request::FinishReason;
use crate::engine::update::{AdapterHandle, AdapterVersion};
use crate::error::{Error, Result};

impl Scheduler {
    /// Registers a LoRA adapter read by `Engine::load_adapter`.
    pub(super) fn add_adapter(
        &mut self,
        name: String,
        adapter: Arc<SlotImage>,
        reply: Replier<AdapterHandle>,
    ) {
        let t = &mut self.adapters;
        if t.slots.is_empty() {
            reply.send(Err(Error::InvalidInput(format!(
                "LoRA adapters are off on engine `{}`; start it with adapters enabled (EngineOptions::lora, --enable-lora)",
                self.info.key
            ))));
            return;
        }
        let version = t.versions.get(&name).copied().unwrap_or(0) + 1;
        t.versions.insert(name.clone(), version);
        let id = t.next_id;
        t.next_id += 1;
        let handle = AdapterHandle {
            id,
            version: AdapterVersion {
                name,
                version,
                digest: adapter.digest.clone(),
            },
            rank: adapter.rank,
        };
        tracing::info!(
            adapter = %handle.version.name,
            version,
            digest = %handle.version.digest,
            rank = adapter.rank,
            targets = ?adapter.targets,
            "LoRA adapter registered"
        );
        t.adapters.insert(
            id,
            Registered {
                handle: handle.clone(),
                ns: namespace(&adapter.digest),
                adapter,
                retired: false,
            },
        );
        reply.send(Ok(handle));
    }

    /// Retires adapter `id`: no new request starts on it (requests waiting on it that have
    /// not started move to the newest version of its name, or fail when there is none); the
    /// requests that started on it finish on it (`drain`) or end now as
    /// [`FinishReason::Interrupted`].
    pub(super) fn retire_adapter(&mut self, id: u64, drain: bool, reply: Replier<()>) {
        let Some(r) = self.adapters.adapters.get_mut(&id) else {
            reply.send(Err(Error::InvalidInput(format!(
                "no adapter with id {id} is registered with this engine"
            ))));
            return;
        };
        r.retired = true;
        let name = r.handle.version.name.clone();
        let successor = self.adapters.newest(&name).cloned();
        let waiting = std::mem::take(&mut self.waiting);
        for mut s in waiting {
            let on_it = s.request.adapter.as_ref().is_some_and(|h| h.id == id);
            let started = s.admitted.is_some();
            if !on_it || (started && drain) {
                self.waiting.push_back(s);
            } else if started {
                // Preempted on it and not drained: it ends as a running one does.
                if s.swapped.is_some() {
                    self.kv.unreserve_swap(self.kv.blocks_for(s.computed));
                }
                self.finish(s, FinishReason::Interrupted);
            } else if let Some(next) = &successor {
                s.ns = self.adapters.ns_of(next.id);
                s.request.adapter = Some(next.clone());
                self.waiting.push_back(s);
            } else {
                self.stats.lock().requests_failed += 1;
                s.reply.send(Err(Error::InvalidInput(format!(
                    "adapter `{name}` was removed before this request started"
                ))));
            }
        }
        if !drain {
            self.settle();
            let mut i = 0;
            while i < self.running.len() {
                if self.running[i]
                    .request
                    .adapter
                    .as_ref()
                    .is_some_and(|h| h.id == id)
                {
                    let s = self.running.remove(i);
                    self.finish(s, FinishReason::Interrupted);
                } else {
                    i += 1;
                }
            }
        }
        self.drop_retired_adapters();
        reply.send(Ok(()));
    }

    /// Removes retired adapters that no request uses any more (their slot frees up).
    pub(super) fn drop_retired_adapters(&mut self) {
        if !self.adapters.adapters.values().any(|r| r.retired) {
            return;
        }
        let on = |id: u64| move |s: &Seq| s.request.adapter.as_ref().is_some_and(|h| h.id == id);
        let gone: Vec<u64> = self
            .adapters
            .adapters
            .values()
            .filter(|r| r.retired)
            .map(|r| r.handle.id)
            .filter(|&id| !self.running.iter().any(on(id)) && !self.waiting.iter().any(on(id)))
            .collect();
        for id in gone {
            if let Some(r) = self.adapters.adapters.remove(&id) {
                tracing::info!(adapter = %r.handle.version.name, version = r.handle.version.version, "LoRA adapter version dropped");
            }
            if let Some(slot) = self.adapters.slot_of(id) {
                self.adapters.slots[slot] = None;
            }
        }
    }

    /// Checks the adapter a new request (or a scoring) names and gives its prefix-cache
    /// namespace: a retired version moves to the newest of its name.
    pub(super) fn adapter_of_new(&self, adapter: &mut Option<AdapterHandle>) -> Result<u64> {
        let Some(h) = adapter else {
            return Ok(0);
        };
        let t = &self.adapters;
        if t.adapters.get(&h.id).is_some_and(|r| !r.retired) {
            return Ok(t.ns_of(h.id));
        }
        let Some(next) = t.newest(&h.version.name).cloned() else {
            return Err(Error::InvalidInput(format!(
                "adapter `{}` (version {}) is not registered with engine `{}`; load it with Engine::load_adapter",
                h.version.name, h.version.version, self.info.key
            )));
        };
        *h = next;
        Ok(t.ns_of(h.id))
    }

    /// The slot of adapter `h` (a waiting request's), moving the adapter in when it is not
    /// resident: `Ok(None)` for the base; `Err(None)` when every slot is used by running
    /// requests (the request waits); `Err(Some(e))` when moving it in failed.
    pub(super) fn adapter_slot(
        &mut self,
        h: Option<&AdapterHandle>,
    ) -> std::result::Result<Option<u32>, Option<Error>> {
        let Some(h) = h else {
            return Ok(None);
        };
        let id = h.id;
        self.adapters.clock += 1;
        let now = self.adapters.clock;
        if let Some(slot) = self.adapters.slot_of(id) {
            self.adapters.slots[slot] = Some((id, now));
            return Ok(Some(slot as u32));
        }
        let busy = |slot: usize| self.running.iter().any(|r| r.slot == Some(slot as u32));
        let free = (0..self.adapters.slots.len())
            .filter(|&i| !busy(i))
            .min_by_key(|&i| self.adapters.slots[i].map_or(0, |(_, used)| used));
        let Some(slot) = free else {
            return Err(None);
        };
        let Some(r) = self.adapters.adapters.get(&id) else {
            return Err(Some(Error::Engine(format!(
                "adapter `{}` left the engine",
                h.version.name
            ))));
        };
        let started = std::time::Instant::now();
        if let Err(e) = self.runner.load_adapter(slot, &r.adapter) {
            // The slot may hold parts of two adapters now: nobody may use it until rewritten.
            self.adapters.slots[slot] = None;
            return Err(Some(e));
        }
        tracing::debug!(adapter = %h.version.name, slot, ms = started.elapsed().as_secs_f64() * 1e3, "LoRA adapter moved into a device slot");
        self.adapters.slots[slot] = Some((id, now));
        self.stats.lock().adapter_loads += 1;
        Ok(Some(slot as u32))
    }
}
