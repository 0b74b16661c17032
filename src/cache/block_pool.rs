//! `BlockPool`: fixed-size KV blocks with reference counts.
//!
//! Invariants: a refcount never goes below zero (releasing a free block is an error, not a
//! wrap-around); a block is on the free list exactly when its count is 0.

use crate::error::{Error, Result};

/// A pool of `num_blocks` KV blocks.
#[derive(Debug, Clone)]
pub struct BlockPool {
    refs: Vec<u32>,
    free: Vec<u32>,
}

impl BlockPool {
    /// A pool with every block free.
    pub fn new(num_blocks: usize) -> Self {
        Self {
            refs: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
        }
    }

    /// Total blocks.
    pub fn capacity(&self) -> usize {
        self.refs.len()
    }

    /// Blocks with refcount 0.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks in use.
    pub fn num_used(&self) -> usize {
        self.capacity() - self.num_free()
    }

    /// Takes `n` free blocks (refcount 1 each), or `None` (taking nothing) if fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let out = self.free.split_off(self.free.len() - n);
        for &b in &out {
            self.refs[b as usize] = 1;
        }
        Some(out)
    }

    /// Adds a reference to each block (they must be in use).
    pub fn retain(&mut self, blocks: &[u32]) -> Result<()> {
        for &b in blocks {
            match self.refs.get_mut(b as usize) {
                Some(r) if *r > 0 => *r += 1,
                _ => {
                    return Err(Error::Engine(format!(
                        "retain of block {b} that is not in use"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Drops a reference to each block; those reaching 0 become free.
    pub fn release(&mut self, blocks: &[u32]) -> Result<()> {
        for &b in blocks {
            match self.refs.get_mut(b as usize) {
                Some(r) if *r > 0 => {
                    *r -= 1;
                    if *r == 0 {
                        self.free.push(b);
                    }
                }
                _ => {
                    return Err(Error::Engine(format!(
                        "release of block {b} whose refcount is already 0"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The refcount of a block.
    pub fn refcount(&self, block: u32) -> u32 {
        self.refs.get(block as usize).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_free_only_at_refcount_zero_and_never_goes_negative() {
        let mut p = BlockPool::new(4);
        let a = p.allocate(2).unwrap();
        p.retain(&a[..1]).unwrap();
        p.release(&a).unwrap();
        assert_eq!(p.num_free(), 3);
        assert_eq!(p.refcount(a[0]), 1);
        p.release(&a[..1]).unwrap();
        assert_eq!(p.num_free(), 4);
        assert!(p.release(&a[..1]).is_err());
        assert!(p.allocate(5).is_none());
        assert_eq!(p.num_free(), 4);
    }
}
