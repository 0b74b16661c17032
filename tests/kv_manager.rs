//! `KvManager` without a model: admission reuses cached prefixes, a lookup that is not admitted
//! leaves the memory and the counters as they were, releases feed the prefix cache, eviction
//! frees unpinned prefixes when the pool is short, swap reservations keep to their budget.

use policy_serve::cache::KvManager;

fn seq(start: u32, n: u32) -> Vec<u32> {
    (start..start + n).collect()
}

#[test]
fn a_released_prefix_is_reused_by_the_next_admission() {
    let mut kv = KvManager::new(8, 4, 100, true, 0);
    let a = seq(0, 8);
    let got = kv.admit(&a, 9, |_| false).expect("room for 3 blocks");
    assert_eq!((got.blocks.len(), got.cached_tokens), (3, 0));
    kv.release(&a, &got.blocks, got.pin);
    // The tree keeps the 2 whole blocks; the partial third block went back to the pool.
    assert_eq!(kv.num_free(), 6);
    let mut b = a.clone();
    b.extend(seq(100, 3));
    let hit = kv.admit(&b, b.len() + 1, |_| false).expect("room");
    assert_eq!(hit.cached_tokens, 8);
    assert_eq!(
        &hit.blocks[..2],
        &got.blocks[..2],
        "the cached blocks come first"
    );
    let stats = kv.stats().cache.expect("prefix cache on");
    assert_eq!((stats.lookups, stats.hit_tokens), (2, 8));
}

#[test]
fn a_lookup_that_is_not_admitted_is_not_counted_and_takes_nothing() {
    let mut kv = KvManager::new(4, 4, 100, true, 0);
    let a = seq(0, 8);
    let got = kv.admit(&a, 9, |_| false).expect("room");
    kv.release(&a, &got.blocks, got.pin);
    let before = kv.stats();
    // Needs 5 blocks, 2 of them cached (pinned by this lookup, so not evictable): 3 fresh of 2.
    let mut b = a.clone();
    b.extend(seq(200, 10));
    assert!(kv.admit(&b, b.len() + 1, |_| false).is_none());
    assert_eq!(kv.stats(), before, "a failed admission changes nothing");
    // Deferred by the caller (its prefix is being computed elsewhere): the same.
    assert!(kv.admit(&b[..12], 13, |cached| cached == 8).is_none());
    assert_eq!(kv.stats(), before);
    // Positive control: a request that fits is admitted and counted.
    let c: Vec<u32> = a.iter().copied().chain(seq(300, 3)).collect();
    assert!(kv.admit(&c, c.len() + 1, |_| false).is_some());
    let after = kv.stats().cache.expect("on");
    assert_eq!(after.lookups, before.cache.expect("on").lookups + 1);
}

#[test]
fn allocation_evicts_unpinned_prefixes_when_the_pool_is_short() {
    let mut kv = KvManager::new(4, 4, 100, true, 0);
    let a = seq(0, 16);
    let got = kv.admit(&a, 16, |_| false).expect("room");
    kv.release(&a, &got.blocks, got.pin);
    assert_eq!(kv.num_free(), 0, "the tree holds every block");
    let fresh = kv.allocate(3).expect("eviction frees the cached prefix");
    assert_eq!(fresh.len(), 3);
    // Eviction takes whole leaves: the 4-block prefix went, one block is free again.
    assert_eq!(kv.stats().cache.expect("on").evicted_blocks, 4);
    assert_eq!(kv.num_free(), 1);
    assert!(kv.allocate(2).is_none(), "nothing is left to evict");
    assert_eq!(kv.num_free(), 1, "a failed allocation takes nothing");
}

#[test]
fn swap_reservations_stay_within_the_budget() {
    let mut kv = KvManager::new(8, 4, 1000, false, 2500);
    assert!(kv.can_swap());
    assert!(kv.reserve_swap(2));
    assert!(!kv.reserve_swap(1), "2000 + 1000 bytes exceed 2500");
    assert_eq!(kv.stats().swap_used_bytes, 2000);
    kv.unreserve_swap(2);
    assert!(kv.reserve_swap(2));
    let none = KvManager::new(8, 4, 1000, false, 0);
    assert!(!none.can_swap());
}

#[test]
fn without_a_prefix_cache_nothing_is_reused() {
    let mut kv = KvManager::new(8, 4, 100, false, 0);
    let a = seq(0, 8);
    let got = kv.admit(&a, 9, |_| false).expect("room");
    kv.release(&a, &got.blocks, got.pin);
    assert_eq!(kv.num_free(), 8, "every block went back to the pool");
    let again = kv.admit(&a, 9, |_| false).expect("room");
    assert_eq!(again.cached_tokens, 0);
    assert!(kv.stats().cache.is_none());
}
