//! `DiskTier`: KV blocks in files under one directory, one file per block named by its
//! [`BlockKey`], with a checksum; least recently used first out under a byte cap. The
//! directory outlives the process: a restarted engine indexes the files already there.
//!
//! File layout: `MAGIC` (8 bytes), the key (16, little-endian), the data's length (8), its
//! checksum (8), the data. A file is written under a temporary name and renamed, so a crash
//! never leaves a half-written block under a block's name.
//!
//! Invariants: `used` is the sum of the indexed files' data lengths and stays at or under the
//! cap; a block whose file is missing, short, or fails its checksum is never returned (it is
//! dropped from the index and its file removed). The first write or read error (a full disk,
//! a read-only directory) turns the tier off for good, with one warning.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::keys::{BlockKey, checksum};

const MAGIC: &[u8; 8] = b"PSKVBLK1";
const HEADER: usize = 40;

/// What reading a block from disk gave.
#[derive(Debug)]
pub enum DiskRead {
    /// The block's bytes, checksum verified.
    Ok(Vec<u8>),
    /// Not indexed, or its file went away.
    Missing,
    /// The file is short, has another key or length, or fails its checksum.
    Corrupt,
}

struct Entry {
    len: usize,
    tick: u64,
}

/// Blocks on local disk.
pub struct DiskTier {
    dir: PathBuf,
    cap: usize,
    used: usize,
    index: HashMap<BlockKey, Entry>,
    lru: BTreeMap<u64, BlockKey>,
    clock: u64,
    enabled: bool,
}

impl DiskTier {
    /// Opens (creating it if needed) the tier in `dir` with a cap of `cap` bytes, indexing the
    /// blocks already there (oldest first by modification time; beyond the cap the oldest are
    /// removed). A directory that cannot be created or written gives a tier that is off (with
    /// a warning): serving goes on without it.
    pub fn open(dir: &Path, cap: usize) -> Self {
        let mut t = Self {
            dir: dir.to_path_buf(),
            cap,
            used: 0,
            index: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
            enabled: true,
        };
        if let Err(e) = t.scan() {
            t.turn_off("opening", &e);
        }
        t
    }

    fn scan(&mut self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let probe = self.dir.join(".probe.tmp");
        std::fs::write(&probe, b"ok")?;
        std::fs::remove_file(&probe)?;
        let mut found = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().to_string();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let Some(key) = name.strip_suffix(".kv").and_then(BlockKey::from_hex) else {
                continue;
            };
            let meta = e.metadata()?;
            let len = (meta.len() as usize).saturating_sub(HEADER);
            let mtime = meta.modified().ok();
            found.push((mtime, key, len));
        }
        found.sort();
        for (_, key, len) in found {
            self.index_block(key, len);
        }
        while self.used > self.cap && self.drop_lru(|_| false) {}
        if !self.index.is_empty() {
            tracing::info!(dir = %self.dir.display(), blocks = self.index.len(), bytes = self.used, "disk KV tier: blocks from an earlier run indexed");
        }
        Ok(())
    }

    fn index_block(&mut self, key: BlockKey, len: usize) {
        self.clock += 1;
        if let Some(old) = self.index.insert(
            key,
            Entry {
                len,
                tick: self.clock,
            },
        ) {
            self.lru.remove(&old.tick);
            self.used -= old.len;
        }
        self.lru.insert(self.clock, key);
        self.used += len;
    }

    fn unindex(&mut self, key: &BlockKey) -> bool {
        let Some(e) = self.index.remove(key) else {
            return false;
        };
        self.lru.remove(&e.tick);
        self.used -= e.len;
        true
    }

    fn path(&self, key: &BlockKey) -> PathBuf {
        self.dir.join(format!("{}.kv", key.hex()))
    }

    fn turn_off(&mut self, doing: &str, e: &std::io::Error) {
        if self.enabled {
            tracing::warn!(dir = %self.dir.display(), error = %e, "disk KV tier off after an error while {doing}; serving goes on without it");
        }
        self.enabled = false;
        self.index.clear();
        self.lru.clear();
        self.used = 0;
    }

    /// Whether the tier is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether `key` is indexed.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.index.contains_key(key)
    }

    /// Blocks indexed.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no block is indexed.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Bytes of block data indexed.
    pub fn bytes(&self) -> usize {
        self.used
    }

    /// Removes the least recently used block for which `keep` is false; false if none.
    pub fn drop_lru(&mut self, keep: impl Fn(&BlockKey) -> bool) -> bool {
        let Some(key) = self.lru.values().find(|k| !keep(k)).copied() else {
            return false;
        };
        self.unindex(&key);
        let _ = std::fs::remove_file(self.path(&key));
        true
    }

    /// Indexes a block written by [`write_file`] (on another thread).
    pub fn record(&mut self, key: BlockKey, len: usize) {
        if self.enabled {
            self.index_block(key, len);
        }
    }

    /// A write of [`write_file`] failed: the tier turns off (once, with a warning).
    pub fn fail(&mut self, e: &std::io::Error) {
        self.turn_off("writing a block", e);
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `bytes` more fit under the cap with `queued` bytes still on their way.
    pub fn room_with(&self, queued: usize, bytes: usize) -> bool {
        self.used + queued + bytes <= self.cap
    }

    /// Reads a block of `len` bytes, verifying the header and the checksum; a bad block is
    /// removed (index and file).
    pub fn read(&mut self, key: &BlockKey, len: usize) -> DiskRead {
        self.read_many(std::slice::from_ref(key), len)
            .pop()
            .unwrap_or(DiskRead::Missing)
    }

    /// Reads the blocks of `keys` (`len` bytes each), their files read and checked on the
    /// rayon pool at once (a transcript's blocks are hundreds of files: one thread read and
    /// checked them at ~0.6 GB/s with the page cache dropped, on the H200 host), then taken
    /// in order: the reads up to and including the first that is not [`DiskRead::Ok`], whose
    /// block is dropped from the index as [`DiskTier::read`] drops it; the blocks after it
    /// are left as they were.
    pub fn read_many(&mut self, keys: &[BlockKey], len: usize) -> Vec<DiskRead> {
        let files = self.plan_reads(keys, len).read_now();
        self.settle_reads(files)
    }

    /// The files of `keys` as a job any thread may run ([`DiskReads::run`]); its results go
    /// back through [`DiskTier::settle_reads`]. (The split lets a reader thread do the I/O
    /// while this tier stays with its owner.)
    pub fn plan_reads(&self, keys: &[BlockKey], len: usize) -> DiskReads {
        DiskReads {
            keys: keys.to_vec(),
            files: keys
                .iter()
                .map(|k| (self.enabled && self.index.contains_key(k)).then(|| self.path(k)))
                .collect(),
            len,
        }
    }

    /// [`DiskTier::read_many`]'s results from a job's reads: in order, up to and including
    /// the first that is not [`DiskRead::Ok`].
    pub fn settle_reads(&mut self, done: ReadFiles) -> Vec<DiskRead> {
        let ReadFiles { job, read } = done;
        if !self.enabled {
            return job
                .keys
                .first()
                .map(|_| DiskRead::Missing)
                .into_iter()
                .collect();
        }
        let mut out = Vec::with_capacity(job.keys.len());
        for ((key, path), res) in job.keys.iter().zip(&job.files).zip(read) {
            let got = match (path, res) {
                (Some(path), Some(res)) => self.settle(key, path, res),
                _ => DiskRead::Missing,
            };
            let ok = matches!(got, DiskRead::Ok(_));
            out.push(got);
            if !ok {
                break;
            }
        }
        out
    }

    /// What one file's read gave, the index and the LRU order updated for it.
    fn settle(&mut self, key: &BlockKey, path: &Path, res: Result<Vec<u8>, ReadFail>) -> DiskRead {
        match res {
            Err(ReadFail::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                self.unindex(key);
                DiskRead::Missing
            }
            Err(ReadFail::Corrupt) => {
                self.unindex(key);
                let _ = std::fs::remove_file(path);
                DiskRead::Corrupt
            }
            Err(ReadFail::Io(e)) => {
                self.turn_off("reading a block", &e);
                DiskRead::Missing
            }
            Ok(data) => {
                self.clock += 1;
                if let Some(e) = self.index.get_mut(key) {
                    self.lru.remove(&e.tick);
                    e.tick = self.clock;
                    self.lru.insert(self.clock, *key);
                }
                DiskRead::Ok(data)
            }
        }
    }
}

/// The threads block files are read on: a pool of their own (8 threads), so that reads never
/// hold up the rayon pool the grammar masks use; `None` if its threads could not be started
/// (reads then run on the caller's pool).
pub fn io_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: once_cell::sync::Lazy<Option<rayon::ThreadPool>> =
        once_cell::sync::Lazy::new(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(8)
                .thread_name(|i| format!("kv-disk-read-{i}"))
                .build()
                .map_err(|e| tracing::warn!(error = %e, "no threads for KV disk reads"))
                .ok()
        });
    POOL.as_ref()
}

/// Block files to read, planned by [`DiskTier::plan_reads`]: plain paths, so any thread may
/// read them.
#[derive(Clone)]
pub struct DiskReads {
    keys: Vec<BlockKey>,
    /// Each key's file, `None` for a block the tier does not hold.
    files: Vec<Option<PathBuf>>,
    len: usize,
}

impl DiskReads {
    /// [`DiskReads::run`] on the disk-read threads ([`io_pool`]), the caller waiting.
    pub fn read_now(self) -> ReadFiles {
        match io_pool() {
            Some(pool) => pool.install(|| self.run()),
            None => self.run(),
        }
    }

    /// Reads and checks the files, on the current rayon pool at once.
    pub fn run(self) -> ReadFiles {
        use rayon::prelude::*;
        let read = self
            .files
            .par_iter()
            .zip(&self.keys)
            .map(|(path, key)| path.as_ref().map(|p| read_file(p, key, self.len)))
            .collect();
        ReadFiles { job: self, read }
    }

    /// How many blocks it reads.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it reads nothing.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A [`DiskReads`] job's results, for [`DiskTier::settle_reads`].
pub struct ReadFiles {
    job: DiskReads,
    read: Vec<Option<Result<Vec<u8>, ReadFail>>>,
}

/// Why a block's file gave no data.
enum ReadFail {
    /// Opening or reading it failed.
    Io(std::io::Error),
    /// It is short or long, has another key or length, or fails its checksum.
    Corrupt,
}

/// The data of block `key`'s file at `path` (`len` bytes).
fn read_file(path: &Path, key: &BlockKey, len: usize) -> Result<Vec<u8>, ReadFail> {
    let mut buf = Vec::with_capacity(HEADER + len);
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut buf))
        .map_err(ReadFail::Io)?;
    let ok = buf.len() == HEADER + len
        && &buf[..8] == MAGIC
        && buf[8..24] == key.0.to_le_bytes()
        && buf[24..32] == (len as u64).to_le_bytes()
        && buf[32..40] == checksum(&buf[HEADER..]).to_le_bytes();
    if !ok {
        return Err(ReadFail::Corrupt);
    }
    buf.drain(..HEADER);
    Ok(buf)
}

/// Writes one block's file under `dir` (a temporary name, then renamed): the tier's writer
/// thread does this; [`DiskTier::record`] indexes it after.
pub fn write_file(dir: &Path, key: BlockKey, data: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!("{}.tmp", key.hex()));
    let res = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        let mut head = Vec::with_capacity(HEADER);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&key.0.to_le_bytes());
        head.extend_from_slice(&(data.len() as u64).to_le_bytes());
        head.extend_from_slice(&checksum(data).to_le_bytes());
        f.write_all(&head)?;
        f.write_all(data)?;
        f.flush()?;
        drop(f);
        std::fs::rename(&tmp, dir.join(format!("{}.kv", key.hex())))
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes and indexes a block as the writer thread and `DiskWriter::drain` do.
    fn put(t: &mut DiskTier, key: BlockKey, data: &[u8]) -> bool {
        write_file(&t.dir, key, data).is_ok() && {
            t.record(key, data.len());
            true
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ps-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn blocks_survive_reopening_and_bad_files_are_never_returned() {
        let d = dir("reopen");
        let (a, b, c) = (BlockKey(1), BlockKey(2), BlockKey(3));
        let mut t = DiskTier::open(&d, 1 << 20);
        assert!(
            put(&mut t, a, &[7; 100]) && put(&mut t, b, &[8; 100]) && put(&mut t, c, &[9; 100])
        );
        drop(t);
        let mut t = DiskTier::open(&d, 1 << 20);
        assert_eq!((t.len(), t.bytes()), (3, 300));
        assert!(matches!(t.read(&a, 100), DiskRead::Ok(v) if v == vec![7; 100]));
        // One byte flipped in b's data; c truncated.
        let pb = t.path(&b);
        let mut bytes = std::fs::read(&pb).unwrap();
        bytes[HEADER + 50] ^= 1;
        std::fs::write(&pb, bytes).unwrap();
        let pc = t.path(&c);
        let bytes = std::fs::read(&pc).unwrap();
        std::fs::write(&pc, &bytes[..HEADER + 10]).unwrap();
        assert!(matches!(t.read(&b, 100), DiskRead::Corrupt));
        assert!(matches!(t.read(&c, 100), DiskRead::Corrupt));
        assert!(
            !pb.exists() && !t.contains(&b),
            "a corrupt block is removed"
        );
        assert!(matches!(t.read(&b, 100), DiskRead::Missing));
        assert_eq!(t.len(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Blocks read at once come back in order up to the first that fails, which is dropped;
    /// the ones after it stay indexed and readable. Mutations that fail it: the results in
    /// completion order, no stop at the failure (d's read returned), the failed block kept
    /// in the index, the blocks after it dropped too.
    #[test]
    fn blocks_read_at_once_stop_at_the_first_that_fails() {
        let d = dir("many");
        let keys: Vec<BlockKey> = (1..=5).map(BlockKey).collect();
        let mut t = DiskTier::open(&d, 1 << 20);
        for (i, k) in keys.iter().enumerate() {
            assert!(put(&mut t, *k, &[i as u8; 100]));
        }
        let all = t.read_many(&keys, 100);
        assert_eq!(all.len(), 5);
        for (i, r) in all.iter().enumerate() {
            assert!(
                matches!(r, DiskRead::Ok(v) if *v == vec![i as u8; 100]),
                "block {i}"
            );
        }
        // The third block's checksum fails: the first two, then Corrupt, nothing after.
        let p3 = t.path(&keys[2]);
        let mut bytes = std::fs::read(&p3).unwrap();
        bytes[HEADER] ^= 1;
        std::fs::write(&p3, bytes).unwrap();
        let some = t.read_many(&keys, 100);
        assert_eq!(some.len(), 3);
        assert!(matches!(some[1], DiskRead::Ok(ref v) if *v == vec![1; 100]));
        assert!(matches!(some[2], DiskRead::Corrupt));
        assert!(!t.contains(&keys[2]) && !p3.exists());
        assert!(t.contains(&keys[3]) && t.contains(&keys[4]));
        assert!(matches!(
            t.read_many(&keys[3..], 100)[..],
            [DiskRead::Ok(_), DiskRead::Ok(_)]
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_cap_drops_the_oldest_unkept_block() {
        let d = dir("cap");
        let mut t = DiskTier::open(&d, 250);
        assert!(put(&mut t, BlockKey(1), &[1; 100]) && put(&mut t, BlockKey(2), &[2; 100]));
        assert!(!t.room_with(0, 100));
        assert!(t.drop_lru(|k| *k == BlockKey(1)), "1 is kept: 2 goes");
        assert!(t.contains(&BlockKey(1)) && !t.contains(&BlockKey(2)));
        assert!(!t.room_with(0, 300), "larger than the cap");
        let _ = std::fs::remove_dir_all(&d);
    }
}
