#!/usr/bin/env python3
"""A GRPO trainer's weight push, as TRL's VLLMClient drives vLLM's NCCL weight transfer
(written from that protocol; no vLLM needed): the trainer is rank 0, opens a torch TCPStore
(use_libuv=False, world_size = 1 + the server's ranks), publishes the pickled ncclUniqueId at
`broadcast_from/0/0`, opens NCCL through libnccl (ctypes), runs the warm-up all-reduce, then
per update: POST /start_weight_update, POST /update_weights (names, dtype_names, shapes) while
broadcasting the parameters packed into uint8 buffers of at most ~1 GiB, POST
/finish_weight_update.

    python3 scripts/trainer_push.py BASE_URL MODEL_DIR PORT [PUSHES]

Loads MODEL_DIR with transformers (bf16, cuda:0 of this process), pushes it PUSHES times (the
first includes NCCL's warm-up; the rest are the steady state) and prints one line per push:
`push N: S s, B GiB, version V`. Then checks the server's greedy tokens against transformers
teacher-forced on them (argmax agreement per position) and prints `greedy ...`.
"""
import ctypes
import json
import pickle
import sys
import threading
import time
import types
from datetime import timedelta

import requests
import torch
from torch.distributed import TCPStore
from transformers import AutoModelForCausalLM

BASE, MODEL_DIR, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])
PUSHES = int(sys.argv[4]) if len(sys.argv) > 4 else 3
BUFFER = 1 << 30

# The class vLLM pickles (its module path, so the pickle is byte-for-byte vLLM's).
MOD = "vllm.distributed.device_communicators.pynccl_wrapper"
parts = MOD.split(".")
for i in range(1, len(parts) + 1):
    sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))


class ncclUniqueId(ctypes.Structure):  # noqa: N801
    _fields_ = [("internal", ctypes.c_byte * 128)]


ncclUniqueId.__module__ = MOD
sys.modules[MOD].ncclUniqueId = ncclUniqueId

nccl = ctypes.CDLL("libnccl.so.2")
nccl.ncclGetErrorString.restype = ctypes.c_char_p
comm_t = ctypes.c_void_p
nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(comm_t), ctypes.c_int, ncclUniqueId, ctypes.c_int]
nccl.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                               ctypes.c_int, comm_t, ctypes.c_void_p]
nccl.ncclBroadcast.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                               ctypes.c_int, comm_t, ctypes.c_void_p]
NCCL_UINT8, NCCL_FLOAT32, NCCL_SUM = 1, 7, 0


def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: NCCL error {r}: {nccl.ncclGetErrorString(r).decode()}")


def post(path, body):
    r = requests.post(f"{BASE}{path}", json=body, timeout=600)
    if r.status_code != 200:
        raise RuntimeError(f"{path}: {r.status_code} {r.text}")
    return r.json()


def in_thread(path, body):
    box = {}

    def run():
        try:
            box["ok"] = post(path, body)
        except Exception as e:  # noqa: BLE001
            box["err"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, box


def joined(t, box):
    t.join()
    if "err" in box:
        raise box["err"]
    return box["ok"]


world = requests.get(f"{BASE}/get_world_size", timeout=60).json()["world_size"] + 1
info = requests.get(f"{BASE}/server_info", timeout=300).json()
assert info["vllm_config"]["weight_transfer_config"] == {"backend": "nccl"}, info["vllm_config"]

t0 = time.time()
t, box = in_thread("/init_weight_transfer_engine", {"init_info": {
    "master_address": "127.0.0.1", "master_port": PORT, "rank_offset": 1, "world_size": world,
    "packed": True}})
store = TCPStore("127.0.0.1", PORT, world, True, timeout=timedelta(seconds=300), use_libuv=False)
uid = ncclUniqueId()
check(nccl.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
store.set("broadcast_from/0/0", pickle.dumps(uid))
comm = comm_t()
check(nccl.ncclCommInitRank(ctypes.byref(comm), world, uid, 0), "ncclCommInitRank")
stream = torch.cuda.current_stream().cuda_stream
x = torch.zeros(1, device="cuda")
check(nccl.ncclAllReduce(x.data_ptr(), x.data_ptr(), 1, NCCL_FLOAT32, NCCL_SUM, comm, stream), "warm-up")
torch.cuda.synchronize()
print("init:", joined(t, box), f"{time.time() - t0:.2f} s", flush=True)

model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.bfloat16).cuda().eval()
params = [(n, p.detach().contiguous()) for n, p in model.named_parameters()]
meta = {"names": [n for n, _ in params],
        "dtype_names": [str(p.dtype).removeprefix("torch.") for _, p in params],
        "shapes": [list(p.shape) for _, p in params]}
total = sum(p.numel() * p.element_size() for _, p in params)


def push():
    post("/start_weight_update", {})
    t, box = in_thread("/update_weights", {"update_info": meta})
    chunk, size = [], 0
    for _, p in params:
        chunk.append(p.view(torch.uint8).view(-1))
        size += chunk[-1].numel()
        if size > BUFFER:
            flush(chunk)
            chunk, size = [], 0
    if chunk:
        flush(chunk)
    torch.cuda.synchronize()
    joined(t, box)
    return post("/finish_weight_update", {})


def flush(chunk):
    buf = torch.cat(chunk)
    check(nccl.ncclBroadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(), NCCL_UINT8, 0, comm,
                             torch.cuda.current_stream().cuda_stream), "broadcast")


for i in range(PUSHES):
    t0 = time.time()
    r = push()
    dt = time.time() - t0
    print(f"push {i}: {dt:.2f} s, {total / 2**30:.2f} GiB, {total / dt / 2**30:.2f} GiB/s, "
          f"version {r['weights_version']['version']} digest {r['weights_version']['digest']}",
          flush=True)

# Greedy tokens of the server vs transformers teacher-forced on them.
g = torch.Generator().manual_seed(1)
agree = n = 0
for k in range(4):
    prompt = torch.randint(100, 150000, (64,), generator=g).tolist()
    r = post("/v1/completions", {"model": info["vllm_config"]["model_config"]["model"],
                                 "prompt": prompt, "max_tokens": 32, "temperature": 0,
                                 "return_token_ids": True})
    ours = r["choices"][0]["token_ids"]
    assert r["weights_version"]["version"] == PUSHES, r["weights_version"]
    with torch.no_grad():
        ids = torch.tensor([prompt + ours], device="cuda")
        hf = model(ids).logits[0, len(prompt) - 1:-1].argmax(-1).tolist()
    agree += sum(a == b for a, b in zip(ours, hf))
    n += len(ours)
    print(f"greedy prompt {k}: ours {ours[:8]} hf {hf[:8]}", flush=True)
print(f"greedy: server tokens vs transformers argmax on the pushed weights: {agree}/{n} "
      f"({agree / n:.1%}) positions agree", flush=True)
print(json.dumps({"pushes": PUSHES, "agree": agree, "n": n}))
