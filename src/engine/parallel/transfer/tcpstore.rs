//! A client of torch's `TCPStore` (the rendezvous store of `torch.distributed` and of vLLM's
//! `StatelessProcessGroup`), speaking its wire protocol: little-endian, each query a type byte
//! then its arguments, strings and byte strings as a u64 length and the bytes.
//!
//! Invariants: the first message on a connection is `VALIDATE` with torch's magic number;
//! user keys carry torch's `/` prefix (as `TCPStore.set("k")` sends `"/k"`), the join counter
//! `init/` does not; every read has a timeout, so a trainer that never writes a key is an
//! error naming the key, not a hang.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Query types of torch's store (`TCPStoreBackend.hpp`).
mod query {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const WAIT: u8 = 6;
}

/// torch's `validationMagicNumber`.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// The key every process adds 1 to when it joins a store created with a world size.
pub const JOIN_KEY: &str = "init/";
/// The prefix torch puts before every user key.
pub const KEY_PREFIX: &str = "/";

fn err(what: impl std::fmt::Display) -> Error {
    Error::WeightUpdate(format!("rendezvous store: {what}"))
}

/// One connection to a `TCPStore`.
#[derive(Debug)]
pub struct StoreClient {
    stream: TcpStream,
    addr: String,
}

impl StoreClient {
    /// Connects to the store at `host:port`, retrying until `timeout` (the trainer may not
    /// have opened it yet), and validates the connection.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Self> {
        let addr = format!("{host}:{port}");
        let deadline = Instant::now() + timeout;
        let stream = loop {
            let attempt = (host, port)
                .to_socket_addrs()
                .map_err(|e| err(format!("cannot resolve {addr}: {e}")))?
                .find_map(|a| {
                    TcpStream::connect_timeout(&a, Duration::from_millis(500).min(timeout)).ok()
                });
            match attempt {
                Some(s) => break s,
                None if Instant::now() >= deadline => {
                    return Err(err(format!(
                        "nothing answered at {addr} within {timeout:?}; is the trainer's store (master_address, master_port) reachable from the server?"
                    )));
                }
                None => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let _ = stream.set_nodelay(true);
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| err(e.to_string()))?;
        let mut c = Self { stream, addr };
        let mut msg = vec![query::VALIDATE];
        msg.extend_from_slice(&VALIDATION_MAGIC.to_le_bytes());
        c.send(&msg)?;
        Ok(c)
    }

    /// Sets how long a read (a `get` waiting for its key) may wait.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        self.stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| err(e.to_string()))
    }

    fn send(&mut self, msg: &[u8]) -> Result<()> {
        self.stream
            .write_all(msg)
            .and_then(|_| self.stream.flush())
            .map_err(|e| err(format!("write to {}: {e}", self.addr)))
    }

    fn recv(&mut self, buf: &mut [u8], key: &str) -> Result<()> {
        self.stream.read_exact(buf).map_err(|e| {
            let what = if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                "timed out waiting".to_string()
            } else {
                e.to_string()
            };
            err(format!("{what} for `{key}` from {}", self.addr))
        })
    }

    fn push_str(msg: &mut Vec<u8>, s: &[u8]) {
        msg.extend_from_slice(&(s.len() as u64).to_le_bytes());
        msg.extend_from_slice(s);
    }

    /// Sets user key `key` (torch: `store.set(key, value)`).
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let mut msg = vec![query::SET];
        Self::push_str(&mut msg, format!("{KEY_PREFIX}{key}").as_bytes());
        Self::push_str(&mut msg, value);
        self.send(&msg)
    }

    /// Waits until user key `key` exists, then reads it (torch: `store.get(key)`).
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        let full = format!("{KEY_PREFIX}{key}");
        let mut msg = vec![query::WAIT];
        msg.extend_from_slice(&1u64.to_le_bytes());
        Self::push_str(&mut msg, full.as_bytes());
        self.send(&msg)?;
        let mut resp = [0u8; 1];
        self.recv(&mut resp, key)?;
        if resp[0] != 0 {
            return Err(err(format!(
                "unexpected wait answer {} for `{key}`",
                resp[0]
            )));
        }
        let mut msg = vec![query::GET];
        Self::push_str(&mut msg, full.as_bytes());
        self.send(&msg)?;
        let mut len = [0u8; 8];
        self.recv(&mut len, key)?;
        let n = u64::from_le_bytes(len) as usize;
        if n > 1 << 30 {
            return Err(err(format!("`{key}` claims {n} bytes")));
        }
        let mut value = vec![0u8; n];
        self.recv(&mut value, key)?;
        Ok(value)
    }

    /// Adds `delta` to the counter at raw key `key` (no prefix) and returns its new value.
    pub fn add_raw(&mut self, key: &str, delta: i64) -> Result<i64> {
        let mut msg = vec![query::ADD];
        Self::push_str(&mut msg, key.as_bytes());
        msg.extend_from_slice(&delta.to_le_bytes());
        self.send(&msg)?;
        let mut v = [0u8; 8];
        self.recv(&mut v, key)?;
        Ok(i64::from_le_bytes(v))
    }

    /// Adds `delta` to user counter `key` (torch: `store.add(key, delta)`).
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        self.add_raw(&format!("{KEY_PREFIX}{key}"), delta)
    }

    /// Counts this process in (what torch's `TCPStore(world_size=N)` does on connect, and
    /// what the store's creator waits for before it returns).
    pub fn join(&mut self) -> Result<i64> {
        self.add_raw(JOIN_KEY, 1)
    }
}
