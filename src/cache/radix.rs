//! `RadixCache`: a radix tree over token ids at block granularity, mapping cached prefixes to
//! the KV blocks that hold them.
//!
//! Invariants: every edge holds whole blocks (`tokens.len() == blocks.len() * block_size`);
//! the tree holds one pool reference per block in it; a node with `lock > 0` (pinned by a
//! running sequence, counted along the path to the root) is never evicted; only unpinned leaves
//! are evicted, least recently used first; a lookup that ends inside an edge splits it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::BlockPool;
pub use super::radix_types::{CacheStats, Evicted, PrefixMatch};
use crate::error::Result;

const ROOT: usize = 0;

#[derive(Debug)]
struct Node {
    tokens: Vec<u32>,
    blocks: Vec<u32>,
    children: HashMap<Vec<u32>, usize>,
    parent: usize,
    lock: usize,
    last_access: u64,
}

impl Node {
    /// A root: of the tree, or of a namespace (no tokens, never evicted).
    fn root() -> Self {
        Node {
            tokens: vec![],
            blocks: vec![],
            children: HashMap::new(),
            parent: ROOT,
            lock: 0,
            last_access: 0,
        }
    }
}

/// The prefix cache.
#[derive(Debug)]
pub struct RadixCache {
    block_size: usize,
    nodes: Vec<Option<Node>>,
    free_ids: Vec<usize>,
    clock: u64,
    stats: CacheStats,
    /// The root of each namespace other than 0 (which is `ROOT`): prefixes cached under one
    /// namespace (one LoRA adapter's content) are never found from another.
    ns_roots: HashMap<u64, usize>,
}

impl RadixCache {
    /// An empty tree for blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> Self {
        let root = Node::root();
        Self {
            block_size: block_size.max(1),
            nodes: vec![Some(root)],
            free_ids: vec![],
            clock: 0,
            stats: CacheStats::default(),
            ns_roots: HashMap::new(),
        }
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().expect("live node")
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        self.nodes[id].as_mut().expect("live node")
    }

    fn alloc(&mut self, node: Node) -> usize {
        match self.free_ids.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Blocks held by the tree.
    pub fn cached_blocks(&self) -> usize {
        self.stats.cached_blocks
    }

    /// Splits `child` after `keep` blocks; returns the new upper node (which keeps the key).
    fn split(&mut self, child: usize, keep: usize) -> usize {
        let bs = self.block_size;
        let (parent, lock, last_access, upper_tokens, upper_blocks) = {
            let c = self.node_mut(child);
            let upper_tokens: Vec<u32> = c.tokens.drain(..keep * bs).collect();
            let upper_blocks: Vec<u32> = c.blocks.drain(..keep).collect();
            (c.parent, c.lock, c.last_access, upper_tokens, upper_blocks)
        };
        let key = upper_tokens[..bs].to_vec();
        let lower_key = self.node(child).tokens[..bs].to_vec();
        let mid = self.alloc(Node {
            tokens: upper_tokens,
            blocks: upper_blocks,
            children: HashMap::from([(lower_key, child)]),
            parent,
            lock,
            last_access,
        });
        self.node_mut(child).parent = mid;
        self.node_mut(parent).children.insert(key, mid);
        mid
    }

    /// Number of whole blocks at the start of `a` and `b` that are equal.
    fn common_blocks(&self, a: &[u32], b: &[u32]) -> usize {
        let bs = self.block_size;
        a.chunks_exact(bs)
            .zip(b.chunks_exact(bs))
            .take_while(|(x, y)| x == y)
            .count()
    }

    /// The root of namespace `ns` (created on first use; 0 is the tree's root).
    fn root_of(&mut self, ns: u64) -> usize {
        if ns == 0 {
            return ROOT;
        }
        if let Some(&r) = self.ns_roots.get(&ns) {
            return r;
        }
        let r = self.alloc(Node::root());
        self.ns_roots.insert(ns, r);
        r
    }

    /// [`RadixCache::lookup_in`] namespace 0 (the base weights).
    pub fn lookup(&mut self, tokens: &[u32]) -> PrefixMatch {
        self.lookup_in(0, tokens)
    }

    /// Finds the longest cached prefix of `tokens` (whole blocks) in namespace `ns`, pins it
    /// and returns its blocks. Release the match with [`RadixCache::release`]; count it with
    /// [`RadixCache::record_lookup`] when it is used.
    pub fn lookup_in(&mut self, ns: u64, tokens: &[u32]) -> PrefixMatch {
        self.clock += 1;
        let now = self.clock;
        let bs = self.block_size;
        let mut node = self.root_of(ns);
        let mut pos = 0;
        let mut blocks = Vec::new();
        while tokens.len() - pos >= bs {
            let Some(&child) = self.node(node).children.get(&tokens[pos..pos + bs]) else {
                break;
            };
            let n = self.common_blocks(&self.node(child).tokens, &tokens[pos..]);
            let edge_blocks = self.node(child).blocks.len();
            let next = if n < edge_blocks {
                self.split(child, n)
            } else {
                child
            };
            blocks.extend_from_slice(&self.node(next).blocks);
            pos += n * bs;
            node = next;
            self.node_mut(node).last_access = now;
            if n < edge_blocks {
                break;
            }
        }
        let mut id = node;
        loop {
            let nd = self.node_mut(id);
            nd.lock += 1;
            nd.last_access = now;
            if id == ROOT {
                break;
            }
            id = nd.parent;
        }
        PrefixMatch {
            node,
            blocks,
            tokens: pos,
        }
    }

    /// Counts one lookup that was used: `looked_up` tokens asked for, `hit` found. A lookup
    /// counts only when its request is admitted, so a request that waits is counted once.
    pub fn record_lookup(&mut self, looked_up: usize, hit: usize) {
        self.stats.lookups += 1;
        self.stats.lookup_tokens += looked_up as u64;
        self.stats.hit_tokens += hit as u64;
    }

    /// Unpins a match (every node from `node` to the root).
    pub fn release(&mut self, node: usize) {
        let mut id = node;
        loop {
            let nd = self.node_mut(id);
            debug_assert!(nd.lock > 0, "release of an unpinned node");
            nd.lock = nd.lock.saturating_sub(1);
            if id == ROOT {
                break;
            }
            id = nd.parent;
        }
    }

    /// [`RadixCache::insert_in`] namespace 0 (the base weights).
    pub fn insert(
        &mut self,
        tokens: &[u32],
        blocks: &[u32],
        pool: &mut BlockPool,
    ) -> Result<usize> {
        self.insert_in(0, tokens, blocks, pool)
    }

    /// Inserts the whole blocks of `tokens` into namespace `ns` with the `blocks` that hold
    /// their KV (`blocks[i]` holds tokens `i*bs..(i+1)*bs`; a trailing partial block is
    /// ignored). The tree takes a pool reference on each block it adds; blocks of prefixes it
    /// already holds are left to the caller. Returns the number of blocks added.
    pub fn insert_in(
        &mut self,
        ns: u64,
        tokens: &[u32],
        blocks: &[u32],
        pool: &mut BlockPool,
    ) -> Result<usize> {
        self.clock += 1;
        let now = self.clock;
        let bs = self.block_size;
        let n_blocks = (tokens.len() / bs).min(blocks.len());
        let tokens = &tokens[..n_blocks * bs];
        let mut node = self.root_of(ns);
        let mut pos = 0;
        while pos < tokens.len() {
            let key = &tokens[pos..pos + bs];
            match self.node(node).children.get(key).copied() {
                Some(child) => {
                    let n = self.common_blocks(&self.node(child).tokens, &tokens[pos..]);
                    let next = if n < self.node(child).blocks.len() {
                        self.split(child, n)
                    } else {
                        child
                    };
                    self.node_mut(next).last_access = now;
                    pos += n * bs;
                    node = next;
                }
                None => {
                    let new_blocks = blocks[pos / bs..n_blocks].to_vec();
                    pool.retain(&new_blocks)?;
                    let added = new_blocks.len();
                    let id = self.alloc(Node {
                        tokens: tokens[pos..].to_vec(),
                        blocks: new_blocks,
                        children: HashMap::new(),
                        parent: node,
                        lock: 0,
                        last_access: now,
                    });
                    self.node_mut(node).children.insert(key.to_vec(), id);
                    self.stats.cached_blocks += added;
                    return Ok(added);
                }
            }
        }
        Ok(0)
    }

    /// Evicts unpinned leaves, least recently used first, until at least `want` blocks went
    /// back to the pool's free list (or nothing more can be evicted). Returns blocks freed.
    pub fn evict(&mut self, want: usize, pool: &mut BlockPool) -> Result<usize> {
        self.evict_with(want, pool, &mut |_| {})
    }

    /// [`RadixCache::evict`], calling `sink` with each evicted node before its blocks go back
    /// to the pool (while they still hold its KV): the lower KV tiers copy them there.
    pub fn evict_with(
        &mut self,
        want: usize,
        pool: &mut BlockPool,
        sink: &mut dyn FnMut(Evicted<'_>),
    ) -> Result<usize> {
        let mut heap: BinaryHeap<Reverse<(u64, usize)>> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(id, n)| n.as_ref().map(|n| (id, n)))
            // Roots (of the tree and of namespaces) hold no tokens and are never evicted.
            .filter(|(_, n)| !n.tokens.is_empty() && n.children.is_empty() && n.lock == 0)
            .map(|(id, n)| Reverse((n.last_access, id)))
            .collect();
        let mut freed = 0;
        while freed < want {
            let Some(Reverse((_, id))) = heap.pop() else {
                break;
            };
            let (ns, mut path) = self.path_to(self.node(id).parent);
            let node = self.nodes[id].take().expect("live leaf");
            self.free_ids.push(id);
            path.extend_from_slice(&node.tokens);
            sink(Evicted {
                ns,
                tokens: &path,
                blocks: &node.blocks,
            });
            let before = pool.num_free();
            pool.release(&node.blocks)?;
            freed += pool.num_free() - before;
            self.stats.evicted_blocks += node.blocks.len() as u64;
            self.stats.cached_blocks -= node.blocks.len();
            let parent = self.node_mut(node.parent);
            parent.children.retain(|_, c| *c != id);
            if !parent.tokens.is_empty() && parent.children.is_empty() && parent.lock == 0 {
                heap.push(Reverse((parent.last_access, node.parent)));
            }
        }
        Ok(freed)
    }

    /// The namespace of node `id` and the tokens from its namespace's root to its end.
    fn path_to(&self, mut id: usize) -> (u64, Vec<u32>) {
        let mut edges = Vec::new();
        while !self.node(id).tokens.is_empty() {
            edges.push(id);
            id = self.node(id).parent;
        }
        let ns = if id == ROOT {
            0
        } else {
            self.ns_roots
                .iter()
                .find(|&(_, &r)| r == id)
                .map_or(0, |(&ns, _)| ns)
        };
        let tokens = edges
            .iter()
            .rev()
            .flat_map(|&e| self.node(e).tokens.iter().copied())
            .collect();
        (ns, tokens)
    }

    /// Whether a node is pinned (test and debug aid).
    pub fn is_pinned(&self, node: usize) -> bool {
        self.nodes
            .get(node)
            .and_then(|n| n.as_ref())
            .is_some_and(|n| n.lock > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(v: &[u32]) -> Vec<u32> {
        v.to_vec()
    }

    #[test]
    fn insert_then_lookup_finds_whole_blocks_only() {
        let mut pool = BlockPool::new(16);
        let mut t = RadixCache::new(2);
        let blocks = pool.allocate(3).unwrap();
        assert_eq!(
            t.insert(&seq(&[1, 2, 3, 4, 5, 6, 7]), &blocks, &mut pool)
                .unwrap(),
            3
        );
        let m = t.lookup(&[1, 2, 3, 4, 9, 9]);
        assert_eq!((m.tokens, m.blocks.clone()), (4, blocks[..2].to_vec()));
        assert!(t.is_pinned(m.node));
        t.release(m.node);
        assert!(!t.is_pinned(m.node));
        assert_eq!(
            t.lookup(&[1, 2, 3]).tokens,
            2,
            "a partial trailing block never matches"
        );
    }

    #[test]
    fn a_partial_match_splits_the_edge_and_keeps_both_branches() {
        let mut pool = BlockPool::new(16);
        let mut t = RadixCache::new(1);
        let a = pool.allocate(3).unwrap();
        t.insert(&[1, 2, 3], &a, &mut pool).unwrap();
        let b = pool.allocate(3).unwrap();
        assert_eq!(
            t.insert(&[1, 2, 9], &b, &mut pool).unwrap(),
            1,
            "only the new block is added"
        );
        let m1 = t.lookup(&[1, 2, 3]);
        let m2 = t.lookup(&[1, 2, 9]);
        assert_eq!(m1.blocks, a);
        assert_eq!(m2.blocks, vec![a[0], a[1], b[2]]);
    }

    #[test]
    fn eviction_is_lru_over_unpinned_leaves_and_never_touches_pinned_nodes() {
        let mut pool = BlockPool::new(16);
        let mut t = RadixCache::new(1);
        for s in [[1u32, 10], [2, 20], [3, 30]] {
            let b = pool.allocate(2).unwrap();
            t.insert(&s, &b, &mut pool).unwrap();
            pool.release(&b).unwrap(); // the sequence is done; only the tree holds them
        }
        let pinned = t.lookup(&[1, 10]);
        let touched = t.lookup(&[3, 30]);
        t.release(touched.node);
        // LRU unpinned: [2,20] first, then [3,30]; [1,10] is pinned.
        assert_eq!(t.evict(2, &mut pool).unwrap(), 2);
        let gone = t.lookup(&[2, 20]);
        let kept = t.lookup(&[3, 30]);
        assert_eq!((gone.tokens, kept.tokens), (0, 2));
        t.release(gone.node);
        t.release(kept.node);
        assert_eq!(t.evict(100, &mut pool).unwrap(), 2, "only [3,30] can go");
        assert_eq!(t.lookup(&[1, 10]).tokens, 2, "the pinned path survives");
        t.release(pinned.node);
        assert_eq!(pool.num_free(), 14);
    }

    #[test]
    fn a_block_shared_by_a_sequence_is_not_freed_by_eviction() {
        let mut pool = BlockPool::new(4);
        let mut t = RadixCache::new(1);
        let b = pool.allocate(2).unwrap();
        t.insert(&[5, 6], &b, &mut pool).unwrap();
        // The sequence still holds its references: evicting frees nothing to the pool.
        assert_eq!(t.evict(2, &mut pool).unwrap(), 0);
        assert_eq!(pool.refcount(b[0]), 1);
        pool.release(&b).unwrap();
        assert_eq!(pool.num_free(), 4);
        assert!(pool.release(&b).is_err(), "refcounts never go negative");
    }
}
