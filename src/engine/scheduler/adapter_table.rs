//! The LoRA adapters' table as the scheduler keeps it (plain data; the behaviour is in
//! `adapters.rs`): each registered version with its host copy, prefix-cache namespace and
//! whether it is retired, and which version sits in each device slot, last used when.

use std::collections::HashMap;
use std::sync::Arc;

use crate::engine::model::lora_slots::SlotImage;
use crate::engine::update::AdapterHandle;

/// One registered adapter version.
pub(super) struct Registered {
    pub(super) handle: AdapterHandle,
    pub(super) adapter: Arc<SlotImage>,
    /// Replaced or removed: no new request starts on it.
    pub(super) retired: bool,
    /// Its namespace in the prefix cache.
    pub(super) ns: u64,
}

/// The registered adapters and the device's slots.
#[derive(Default)]
pub(super) struct AdapterTable {
    pub(super) adapters: HashMap<u64, Registered>,
    /// Per slot: the adapter in it and when it was last used.
    pub(super) slots: Vec<Option<(u64, u64)>>,
    pub(super) clock: u64,
    pub(super) next_id: u64,
    /// The latest version number under each name.
    pub(super) versions: HashMap<String, u64>,
}

impl AdapterTable {
    /// A table of `slots` device slots (0: adapters are off).
    pub(super) fn new(slots: usize) -> Self {
        Self {
            slots: vec![None; slots],
            next_id: 1,
            ..Self::default()
        }
    }

    /// Adapter versions registered.
    pub(super) fn len(&self) -> usize {
        self.adapters.len()
    }

    /// The slot adapter `id` sits in.
    pub(super) fn slot_of(&self, id: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.is_some_and(|(a, _)| a == id))
    }

    /// The prefix-cache namespace of adapter `id` (0, the base's, when it is not registered).
    pub(super) fn ns_of(&self, id: u64) -> u64 {
        self.adapters.get(&id).map_or(0, |r| r.ns)
    }

    /// The newest version registered under `name` that is not retired.
    pub(super) fn newest(&self, name: &str) -> Option<&AdapterHandle> {
        self.adapters
            .values()
            .filter(|r| !r.retired && r.handle.version.name == name)
            .max_by_key(|r| r.handle.version.version)
            .map(|r| &r.handle)
    }
}

/// The prefix-cache namespace of an adapter's content (never 0, the base's).
pub(super) fn namespace(digest: &str) -> u64 {
    u64::from_str_radix(digest, 16).unwrap_or(1).max(1)
}
