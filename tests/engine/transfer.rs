//! The pieces of a trainer's weight push that need no GPU: the torch `TCPStore` client
//! against a fake store written from torch's server (`TCPStoreBackend.cpp`), the NCCL id read
//! from the pickles vLLM's `broadcast_obj` stores (fixtures written by
//! `scripts/make_transfer_fixtures.py`), and vLLM's packed-broadcast layout.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use policy_serve::engine::parallel::transfer::tcpstore::{JOIN_KEY, VALIDATION_MAGIC};
use policy_serve::engine::parallel::transfer::{
    Announced, StoreClient, chunks, nccl_id_from_pickle, parse_update_info, unpack,
};

use super::*;

type Kv = Arc<(Mutex<HashMap<Vec<u8>, Vec<u8>>>, Condvar)>;

/// A store as torch's master daemon answers: VALIDATE (magic), SET, GET, ADD (decimal text
/// values), WAIT (answers 0 once every key exists).
fn fake_store() -> (u16, Kv) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let kv: Kv = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
    let shared = kv.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let kv = shared.clone();
            std::thread::spawn(move || serve_conn(conn.unwrap(), kv));
        }
    });
    (port, kv)
}

fn read_n(s: &mut TcpStream, n: usize) -> Option<Vec<u8>> {
    let mut b = vec![0; n];
    s.read_exact(&mut b).ok()?;
    Some(b)
}

fn read_u64(s: &mut TcpStream) -> Option<u64> {
    Some(u64::from_le_bytes(read_n(s, 8)?.try_into().unwrap()))
}

fn read_str(s: &mut TcpStream) -> Option<Vec<u8>> {
    let n = read_u64(s)? as usize;
    read_n(s, n)
}

fn serve_conn(mut s: TcpStream, kv: Kv) -> Option<()> {
    let (map, cv) = &*kv;
    let first = read_n(&mut s, 1)?[0];
    assert_eq!(first, 0, "the first query must be VALIDATE");
    let magic = u32::from_le_bytes(read_n(&mut s, 4)?.try_into().unwrap());
    assert_eq!(magic, VALIDATION_MAGIC);
    loop {
        match read_n(&mut s, 1)?[0] {
            1 => {
                let (k, v) = (read_str(&mut s)?, read_str(&mut s)?);
                map.lock().unwrap().insert(k, v);
                cv.notify_all();
            }
            3 => {
                let k = read_str(&mut s)?;
                let v = map
                    .lock()
                    .unwrap()
                    .get(&k)
                    .cloned()
                    .expect("GET of a key WAITed for");
                s.write_all(&(v.len() as u64).to_le_bytes()).ok()?;
                s.write_all(&v).ok()?;
            }
            4 => {
                let k = read_str(&mut s)?;
                let delta = i64::from_le_bytes(read_n(&mut s, 8)?.try_into().unwrap());
                let mut m = map.lock().unwrap();
                let old: i64 = m
                    .get(&k)
                    .map(|v| String::from_utf8_lossy(v).parse().unwrap())
                    .unwrap_or(0);
                m.insert(k, (old + delta).to_string().into_bytes());
                cv.notify_all();
                s.write_all(&(old + delta).to_le_bytes()).ok()?;
            }
            6 => {
                let n = read_u64(&mut s)? as usize;
                let keys: Vec<Vec<u8>> = (0..n).map(|_| read_str(&mut s)).collect::<Option<_>>()?;
                let mut m = map.lock().unwrap();
                while !keys.iter().all(|k| m.contains_key(k)) {
                    m = cv.wait(m).unwrap();
                }
                s.write_all(&[0]).ok()?;
            }
            other => panic!("unexpected query {other}"),
        }
    }
}

/// Mutations that fail it: dropping the `/` key prefix (the trainer's key is never found),
/// prefixing the join key, skipping VALIDATE (the fake store asserts it).
#[test]
fn the_store_client_joins_and_reads_what_the_trainer_publishes() {
    let (port, kv) = fake_store();
    let mut c = StoreClient::connect("127.0.0.1", port, Duration::from_secs(5)).unwrap();
    assert_eq!(c.join().unwrap(), 1);
    assert_eq!(
        kv.0.lock().unwrap().get(JOIN_KEY.as_bytes()).unwrap(),
        b"1",
        "the trainer's store counts the join at `init/`"
    );
    // The trainer publishes later; get waits for it.
    let trainer = kv.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        trainer
            .0
            .lock()
            .unwrap()
            .insert(b"/broadcast_from/0/0".to_vec(), b"id bytes".to_vec());
        trainer.1.notify_all();
    });
    assert_eq!(c.get("broadcast_from/0/0").unwrap(), b"id bytes");
    c.set("k", b"v").unwrap();
    assert_eq!(c.get("k").unwrap(), b"v");
    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.add("n", -2).unwrap(), 3);
    c.set_timeout(Duration::from_millis(300)).unwrap();
    let e = c.get("never").unwrap_err().to_string();
    assert!(e.contains("timed out waiting for `never`"), "{e}");
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap().port();
    drop(closed);
    let e = StoreClient::connect("127.0.0.1", dead, Duration::from_millis(300)).unwrap_err();
    assert!(e.to_string().contains("nothing answered"), "{e}");
}

#[test]
fn the_nccl_id_is_read_from_vllms_pickles() {
    let dir = common::fixtures().join("weight_transfer");
    let want: Vec<u8> = (0..128).map(|i| ((i * 37 + 5) % 256) as u8).collect();
    for p in [3, 4, 5] {
        let data = std::fs::read(dir.join(format!("nccl_unique_id.p{p}.pickle"))).unwrap();
        assert_eq!(
            nccl_id_from_pickle(&data).unwrap().to_vec(),
            want,
            "protocol {p}"
        );
        let e = nccl_id_from_pickle(&data[..data.len() - 20]).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        // Another class whose name has the same length is refused.
        let mut other = data.clone();
        let at = data.windows(12).position(|w| w == b"ncclUniqueId").unwrap();
        other[at + 11] = b'x';
        let e = nccl_id_from_pickle(&other).unwrap_err();
        assert!(e.to_string().contains("not ncclUniqueId"), "{e}");
    }
    let e = nccl_id_from_pickle(b"\x80\x02N.").unwrap_err();
    assert!(e.to_string().contains("protocol 2"), "{e}");
}

fn announced(bytes: &[usize]) -> Vec<Announced> {
    bytes
        .iter()
        .enumerate()
        .map(|(i, &b)| Announced {
            name: format!("t{i}"),
            torch_dtype: "bfloat16".into(),
            dtype: Some(DType::BF16),
            elem_bytes: 2,
            shape: vec![b / 2],
        })
        .collect()
}

/// The golden layout of vLLM's `packed_nccl_broadcast_producer` with a 100-byte buffer: a
/// chunk closes with the tensor that takes it past 100 bytes; the rest goes last.
#[test]
fn packed_broadcasts_follow_vllms_layout() {
    let t = announced(&[40, 40, 40, 10, 200, 6, 4]);
    let c = chunks(&t, true, 100);
    let got: Vec<(std::ops::Range<usize>, usize)> =
        c.iter().map(|c| (c.tensors.clone(), c.bytes)).collect();
    assert_eq!(got, vec![(0..3, 120), (3..5, 210), (5..7, 10)]);
    let exact = announced(&[50, 50, 2]);
    let got: Vec<_> = chunks(&exact, true, 100)
        .into_iter()
        .map(|c| c.tensors)
        .collect();
    assert_eq!(
        got,
        vec![0..3],
        "exactly full does not close a chunk (> not >=)"
    );
    let one_each: Vec<_> = chunks(&t, false, 100)
        .into_iter()
        .map(|c| c.bytes)
        .collect();
    assert_eq!(one_each, vec![40, 40, 40, 10, 200, 6, 4]);

    let bytes: Vec<u8> = (0..120u32).map(|i| i as u8).collect();
    let parts = unpack(&bytes, &t[0..3]).unwrap();
    assert_eq!(parts[1].name, "t1");
    assert_eq!(parts[1].bytes, (40..80u8).collect::<Vec<_>>());
    assert_eq!(parts[2].shape, vec![20]);
    assert!(unpack(&bytes[..119], &t[0..3]).is_err());

    let info = serde_json::json!({"names": ["a", "b"], "dtype_names": ["bfloat16", "float32"],
        "shapes": [[2, 3], [4]]});
    let a = parse_update_info(&info).unwrap();
    assert_eq!((a[1].dtype, a[1].bytes()), (Some(DType::F32), 16));
    // A dtype the model cannot take is still sized (received, then refused) and dropped by
    // unpack.
    let int8 = serde_json::json!({"names": ["q", "w"], "dtype_names": ["int8", "bfloat16"],
        "shapes": [[3], [2]]});
    let a = parse_update_info(&int8).unwrap();
    assert_eq!((a[0].dtype, a[0].bytes()), (None, 3));
    let parts = unpack(&[1, 2, 3, 4, 5, 6, 7], &a).unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].bytes, vec![4, 5, 6, 7]);
    for (bad, want) in [
        (
            serde_json::json!({"names": ["a"], "dtype_names": [], "shapes": []}),
            "must match",
        ),
        (
            serde_json::json!({"names": ["a"], "dtype_names": ["complex32"], "shapes": [[1]]}),
            "`a`: ",
        ),
        (
            serde_json::json!({"names": ["a"], "dtype_names": ["bfloat16"], "shapes": [[-1]]}),
            "shapes[0]",
        ),
        (
            serde_json::json!({"dtype_names": [], "shapes": []}),
            "needs `names`",
        ),
    ] {
        let e = parse_update_info(&bad).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}
