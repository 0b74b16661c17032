//! The radix prefix cache against a naive reference model (proptest).

use std::collections::HashMap;

use policy_serve::cache::{BlockPool, RadixCache};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u32>),
    Lookup(Vec<u32>),
    Evict(usize),
}

fn op() -> impl Strategy<Value = Op> {
    // A tiny alphabet so that sequences share prefixes and split edges often.
    let s = prop::collection::vec(0u32..3, 0..14);
    prop_oneof![4 => s.clone().prop_map(Op::Insert), 4 => s.prop_map(Op::Lookup), 1 => (0usize..6).prop_map(Op::Evict)]
}

proptest! {
    #[test]
    fn the_tree_matches_a_naive_reference_without_eviction(ops in prop::collection::vec(op(), 1..60)) {
        let bs = 2;
        let mut pool = BlockPool::new(10_000);
        let mut tree = RadixCache::new(bs);
        // Reference: for every cached whole-block prefix, the block holding its last block.
        let mut reference: HashMap<Vec<u32>, u32> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(s) => {
                    let n = s.len() / bs;
                    let blocks = pool.allocate(n).unwrap();
                    tree.insert(&s, &blocks, &mut pool).unwrap();
                    for k in 1..=n {
                        reference.entry(s[..k * bs].to_vec()).or_insert(blocks[k - 1]);
                    }
                    pool.release(&blocks).unwrap();
                }
                Op::Lookup(s) => {
                    let m = tree.lookup(&s);
                    let mut want = Vec::new();
                    for k in 1..=s.len() / bs {
                        match reference.get(&s[..k * bs]) {
                            Some(b) => want.push(*b),
                            None => break,
                        }
                    }
                    prop_assert_eq!(m.tokens, want.len() * bs);
                    prop_assert_eq!(&m.blocks, &want);
                    tree.release(m.node);
                }
                Op::Evict(_) => {}
            }
            // The tree holds exactly one reference per cached block; nothing else is held.
            prop_assert_eq!(pool.num_used(), tree.cached_blocks());
            prop_assert_eq!(tree.cached_blocks(), reference.len());
        }
    }

    #[test]
    fn with_eviction_refcounts_stay_consistent_and_pinned_prefixes_survive(ops in prop::collection::vec(op(), 1..80)) {
        let bs = 2;
        let mut pool = BlockPool::new(10_000);
        let mut tree = RadixCache::new(bs);
        let pin_seq = vec![7u32, 7, 7, 7];
        let b = pool.allocate(2).unwrap();
        tree.insert(&pin_seq, &b, &mut pool).unwrap();
        pool.release(&b).unwrap();
        let pinned = tree.lookup(&pin_seq);
        for op in ops {
            match op {
                Op::Insert(s) => {
                    let blocks = pool.allocate(s.len() / bs).unwrap();
                    tree.insert(&s, &blocks, &mut pool).unwrap();
                    pool.release(&blocks).unwrap();
                }
                Op::Lookup(s) => {
                    let m = tree.lookup(&s);
                    prop_assert!(m.tokens <= s.len() && m.tokens.is_multiple_of(bs));
                    tree.release(m.node);
                }
                Op::Evict(n) => {
                    let before = pool.num_free();
                    let freed = tree.evict(n, &mut pool).unwrap();
                    prop_assert_eq!(pool.num_free() - before, freed);
                }
            }
            prop_assert_eq!(pool.num_used(), tree.cached_blocks());
            let again = tree.lookup(&pin_seq);
            prop_assert_eq!(&again.blocks, &pinned.blocks);
            tree.release(again.node);
        }
        tree.release(pinned.node);
        tree.evict(usize::MAX, &mut pool).unwrap();
        prop_assert_eq!(pool.num_free(), pool.capacity());
    }
}
