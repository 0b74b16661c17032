"""Writes tests/fixtures/weight_transfer/: the pickles of an NCCL unique id as vLLM's
StatelessProcessGroup.broadcast_obj stores them (pickle.dumps of the ctypes ncclUniqueId of
vllm's pynccl_wrapper), in pickle protocols 3, 4 and 5. Byte i of the id is (i * 37 + 5) % 256.
Run: python3 scripts/make_transfer_fixtures.py"""
import ctypes
import os
import pickle
import sys
import types

MOD = "vllm.distributed.device_communicators.pynccl_wrapper"
parts = MOD.split(".")
for i in range(1, len(parts) + 1):
    sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))


class ncclUniqueId(ctypes.Structure):  # noqa: N801 (vLLM's name)
    _fields_ = [("internal", ctypes.c_byte * 128)]


ncclUniqueId.__module__ = MOD
sys.modules[MOD].ncclUniqueId = ncclUniqueId

uid = ncclUniqueId()
for i in range(128):
    uid.internal[i] = ctypes.c_byte((i * 37 + 5) % 256).value
out = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "weight_transfer")
os.makedirs(out, exist_ok=True)
for proto in (3, 4, 5):
    with open(os.path.join(out, f"nccl_unique_id.p{proto}.pickle"), "wb") as f:
        f.write(pickle.dumps(uid, protocol=proto))
print("written to", os.path.normpath(out))
