//! KV memory: the block pool with refcounts (and, later, the radix prefix cache and the host
//! swap tier). Nothing here knows about models or requests.

mod block_pool;

pub use block_pool::BlockPool;
