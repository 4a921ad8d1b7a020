"""V4.1's Engram host tier on a GPU: rows read from a memory-mapped table through pinned staging and a
side-stream copy (``deepinfer_core/models/deepseek_v41/engram_tier.py``), checked and timed.

1. **Check.** Rows fetched to the GPU equal the same rows dequantised on the CPU, bit for bit.
2. **Overlap.** A step's rows for V4.1-Flash's Engram shape (24 columns of 256 FP8 codes + 8 ue8m0 scales per
   token) are fetched while the GPU runs stand-in compute (bf16 GEMMs) queued after the fetch started, as the
   model does (fetch at the step's start, wait at the Engram layer). Reported: the compute alone, the read
   alone (fetch + wait, nothing to hide behind), both in sequence, and overlapped; ``hidden`` is the share of
   the read that the overlap hid, ``(sequential - overlapped) / read``. Also how long ``fetch`` keeps the host.

The table (``--rows`` rows, default 4M = 1.1 GB) is written to a file first, so it is in the page cache as a
large server's 200 GB of tables would be. Run: ``python benchmarks/gpu/engram_tier.py [--tokens 256 8192]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import tempfile
import time

import torch

from deepinfer_core.models.deepseek_v41.engram_tier import EngramTable, map_tensor
from deepinfer_core.ops.quant_formats import scale_to_float32

DIM, BLOCK, COLS = 256, 32, 24


def write_table(path: str, rows: int) -> None:
    """A safetensors file with ``t.weight`` F8_E4M3 ``[rows, 256]`` and ``t.scale`` F8_E8M0 ``[rows, 8]``."""
    g = torch.Generator().manual_seed(0)
    codes = (torch.rand(rows, DIM, generator=g) * 8 - 4).to(torch.float8_e4m3fn)
    scales = torch.randint(118, 136, (rows, DIM // BLOCK), generator=g, dtype=torch.uint8)
    header = {
        "t.weight": {"dtype": "F8_E4M3", "shape": [rows, DIM], "data_offsets": [0, rows * DIM]},
        "t.scale": {
            "dtype": "F8_E8M0",
            "shape": [rows, DIM // BLOCK],
            "data_offsets": [rows * DIM, rows * DIM + rows * DIM // BLOCK],
        },
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.write(codes.view(torch.uint8).numpy().tobytes())
        f.write(scales.numpy().tobytes())


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4 << 20)
    ap.add_argument("--tokens", type=int, nargs="+", default=[256, 8192])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    path = os.path.join(tempfile.mkdtemp(), "engram.safetensors")
    write_table(path, args.rows)
    table = EngramTable(map_tensor(path, "t.weight"), map_tensor(path, "t.scale"), dev)
    cpu = EngramTable(table.codes, table.scales, torch.device("cpu"))
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, table {args.rows} rows "
        f"({os.path.getsize(path) / 1e9:.2f} GB)"
    )

    # 1. check
    ids = torch.randint(0, args.rows, (512, COLS))
    got = table.rows(ids.to(dev), torch.float32).cpu()
    want = cpu.rows(ids, torch.float32)
    ref = table.codes[ids].float().unflatten(-1, (-1, BLOCK)) * scale_to_float32(table.scales[ids]).unsqueeze(
        -1
    )
    assert torch.equal(got, want) and torch.equal(want, ref.flatten(-2)), (
        "GPU rows differ from the stored rows"
    )
    print("check: rows fetched to the GPU equal the stored rows dequantised on the CPU (512 x 24 rows)")

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for tokens in args.tokens:
        measure(table, a, tokens, args.rows, args.repeat)


def measure(table: EngramTable, a: torch.Tensor, tokens: int, rows: int, repeat: int) -> None:
    ids = torch.randint(0, rows, (tokens, COLS), device=a.device)
    read_bytes = tokens * COLS * (DIM + DIM // BLOCK)
    table.rows(ids, torch.bfloat16)  # warm-up: thread, stream, pinned pool
    gemms = 1

    def compute():
        for _ in range(gemms):
            a @ a

    def read():
        table.fetch(ids).wait(torch.bfloat16)

    while timed(compute) < 1.5 * timed(read):
        gemms *= 2

    def sequential():
        compute()
        read()

    holds = []

    def overlapped():
        t0 = time.perf_counter()
        pending = table.fetch(ids)
        holds.append(time.perf_counter() - t0)
        compute()
        pending.wait(torch.bfloat16)

    res = {k: [] for k in ("compute", "read", "sequential", "overlapped")}
    for _ in range(repeat):
        for name, fn in (("compute", compute), ("read", read), ("sequential", sequential),
                         ("overlapped", overlapped)):  # fmt: skip
            res[name].append(timed(fn) * 1e3)
    med = {k: statistics.median(v) for k, v in res.items()}
    hidden = (med["sequential"] - med["overlapped"]) / med["read"]
    print(
        f"tokens {tokens}: rows {tokens * COLS} ({read_bytes / 1e6:.2f} MB), {gemms} GEMMs | median ms: compute "
        f"{med['compute']:.3f}, read {med['read']:.3f} ({read_bytes / med['read'] / 1e6:.2f} GB/s), sequential "
        f"{med['sequential']:.3f}, overlapped {med['overlapped']:.3f} | hidden {hidden:.0%} of the read | "
        f"fetch holds the host {statistics.median(holds) * 1e3:.3f} ms"
    )


if __name__ == "__main__":
    main()
