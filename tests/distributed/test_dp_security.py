"""Data-parallel ranks give nobody else a foothold: the store and the collectives listen on loopback only,
control messages are authenticated JSON (a forged pickle written into the store is never run), and a
multi-host run without a shared secret is refused."""

from __future__ import annotations

import os
import pickle
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.distributed import launcher
from deepinfer_core.distributed.control import ControlChannel, ControlMessageError, new_secret

from ..models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf

KW = dict(kv_cache_memory_bytes=16 << 20, max_model_len=256, max_num_batched_tokens=64)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("v4dpsec")
    build_hf(Schedule("dpsec", (CSA, HCA)), seed=1).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def dp_llm(ckpt):
    llm = LLM(ckpt, data_parallel_size=2, **KW)
    yield llm
    llm.engine.close()


def _non_loopback_address() -> str:
    """An IPv4 address of this machine that is not loopback (the route a packet to elsewhere would take)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent, only a route is looked up
            addr = s.getsockname()[0]
        except OSError:
            addr = ""
    if not addr or addr.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address")
    return addr


def _listening_addresses(pids: list[int]) -> list[str]:
    """``host:port`` of every listening TCP socket that one of ``pids`` holds (Linux /proc)."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux /proc")
    inodes: set[str] = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                host, port = local.split(":")
                out.append(f"{_hex_addr(host, v6)}:{int(port, 16)}")
    return out


def _hex_addr(h: str, v6: bool) -> str:
    raw = bytes.fromhex(h)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def test_store_and_collectives_listen_on_loopback_only(dp_llm):
    eng = dp_llm.engine
    addrs = _listening_addresses([os.getpid(), *(p.pid for p in eng.ctx.procs)])
    assert addrs, "rank 0 hosts the store, so at least one listening socket is expected"
    assert all(a.startswith("127.") for a in addrs), addrs
    port = eng.ctx.store.port
    with pytest.raises(OSError):  # refused: nothing listens there on another interface
        socket.create_connection((_non_loopback_address(), port), timeout=5).close()


class _Exploit:
    """Unpickling this creates a file: what the old workers did with whatever the store held."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_a_forged_command_in_the_store_is_refused_and_never_unpickled(dp_llm, tmp_path):
    eng = dp_llm.engine
    marker = tmp_path / "pwned"
    attacker = dist.TCPStore("127.0.0.1", eng.ctx.store.port, is_master=False, timeout=timedelta(seconds=10))
    key = f"deepinfer/cmd/{eng._cmd + 1}"
    attacker.set(key, pickle.dumps(("run", [[], [(0, _Exploit(str(marker)))]])))
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9, 10]}]
    outs = dp_llm.generate(prompts, params, use_tqdm=False)  # overwrites the key with the real command
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 3]
    assert not marker.exists()
    # a forged result from "rank 1" is refused the same way on rank 0
    channel = ControlChannel(attacker, "x" * 64)
    channel.send("deepinfer/result/999/1", {"outputs": [], "stats": {}})
    with pytest.raises(ControlMessageError, match="authentication"):
        eng.rank.channel.recv("deepinfer/result/999/1")


def test_control_messages_are_authenticated_and_bound_to_their_key():
    store = dist.HashStore()
    secret = new_secret()
    a, b = ControlChannel(store, secret), ControlChannel(store, secret)
    a.send("k/1", {"cmd": "run", "x": [1, 2.5, None, "s"]})
    assert b.recv("k/1") == {"cmd": "run", "x": [1, 2.5, None, "s"]}
    store.set("k/2", store.get("k/1"))  # replayed under another key
    with pytest.raises(ControlMessageError):
        b.recv("k/2")
    raw = bytearray(store.get("k/1"))
    raw[-2] ^= 1  # tampered
    store.set("k/1", bytes(raw))
    with pytest.raises(ControlMessageError):
        b.recv("k/1")
    ControlChannel(store, new_secret()).send("k/3", {"cmd": "exit"})  # another run's secret
    with pytest.raises(ControlMessageError):
        b.recv("k/3")
    store.set("k/4", b"short")
    with pytest.raises(ControlMessageError):
        b.recv("k/4")


def test_torchrun_without_a_shared_secret_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="dist_secret"):
        launcher.init_torchrun(2, "gloo", None, 5.0)
