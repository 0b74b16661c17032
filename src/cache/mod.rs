//! KV memory: the block pool with refcounts, the radix-tree prefix cache, the tiers below
//! the GPU (host memory, local disk) and the [`KvManager`] that owns them all plus the swap
//! accounting (the one type the scheduler uses).
//! Nothing here knows about models, tensors or requests.

mod block_pool;
mod disk_tier;
mod disk_writer;
mod host_tier;
mod keys;
mod manager;
mod radix;
mod radix_types;
mod tier_types;
mod tiers;

pub use block_pool::BlockPool;
pub use disk_tier::{DiskRead, DiskReads, DiskTier, ReadFiles, io_pool, write_file};
pub use disk_writer::{DISK_QUEUE_BLOCKS, DiskWriter};
pub use host_tier::{BlockData, HostBuf, HostTier};
pub use keys::{BlockKey, KeySeed, checksum};
pub use manager::{Admitted, KvManager, KvStats, PendingRead, ReadDone};
pub use radix::{CacheStats, Evicted, PrefixMatch, RadixCache};
pub use tiers::{
    BlockIo, LoadPolicy, LoadTicket, Loaded, PendingFetch, Ticket, Tier, TierConfig, TierStats,
    Tiers,
};
