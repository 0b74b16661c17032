//! KV memory: the block pool with refcounts and the radix-tree prefix cache. Nothing here
//! knows about models or requests.

mod block_pool;
mod radix;

pub use block_pool::BlockPool;
pub use radix::{CacheStats, PrefixMatch, RadixCache};
