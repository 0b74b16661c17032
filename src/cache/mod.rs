//! KV memory: the block pool with refcounts, the radix-tree prefix cache, and the
//! [`KvManager`] that owns both plus the swap accounting (the one type the scheduler uses).
//! Nothing here knows about models, tensors or requests.

mod block_pool;
mod manager;
mod radix;

pub use block_pool::BlockPool;
pub use manager::{Admitted, KvManager, KvStats};
pub use radix::{CacheStats, PrefixMatch, RadixCache};
