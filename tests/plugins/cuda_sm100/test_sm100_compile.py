"""SM100 readiness without the hardware: every kernel of the plugin compiles for ``sm_100a`` at the shapes the
dispatch tables pick, and its PTX holds the instructions expected.

The launches come from ``launches_h200.json``: every distinct launch of the V4-Flash slice on the H200
(``benchmarks/gpu/record_launches.py``; SM100 dispatches with the SM90 tables today, so these are SM100's
shapes too), plus the interpreter's launches of the two kernels the slice never runs. CI compiles a cover of
them (every kernel, every value of each flag or dtype constexpr, each kernel's largest tile);
``python tests/plugins/cuda_sm100/launch_manifest.py --all`` compiles all of them (``docs/platforms/cuda_sm100.md``
records that run). Compiling needs Triton 3.9's bundled ``ptxas-blackwell``, no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import launch_manifest as lm

HERE = Path(__file__).resolve().parent


def _ptxas_blackwell() -> bool:
    try:
        import triton
    except Exception:  # noqa: BLE001
        return False
    tv = tuple(int(x) for x in triton.__version__.split(".")[:2])
    return (
        tv >= (3, 9)
        and (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas-blackwell").exists()
    )


needs_sm100_compiler = pytest.mark.skipif(
    not _ptxas_blackwell(), reason="needs Triton >= 3.9 with ptxas-blackwell"
)


def test_manifest_names_every_launched_kernel():
    """A new kernel (or a renamed one) must be recorded on the GPU before it can ship: the manifest and the
    launchers name the same kernels."""
    recorded = {e["kernel"] for e in lm.load_manifest()}
    assert recorded == lm.launched_kernels()


def test_manifest_matches_the_kernels_parameters():
    """A stale manifest (a kernel's parameters changed since the recording) fails here, not as a confusing
    compile error: each entry names exactly the kernel's parameters, defaults aside."""
    for e in lm.load_manifest():
        fn = lm._jit_of(getattr(__import__(e["module"], fromlist=["_"]), e["kernel"]))
        params = lm._params(fn)
        named = set(e["signature"]) | set(e["constexprs"])
        required = {p.name for p in params if not p.has_default}
        assert required <= named <= {p.name for p in params}, (
            e["kernel"],
            sorted(required - named),
            sorted(named - {p.name for p in params}),
        )


def test_cover_has_every_kernel_and_flag_value():
    entries = lm.load_manifest()
    chosen = lm.cover(entries)
    assert {e["kernel"] for e in chosen} == {e["kernel"] for e in entries}
    for e in entries:
        for k, v in e["constexprs"].items():
            if isinstance(v, bool) or not isinstance(v, int):
                assert any(c["kernel"] == e["kernel"] and c["constexprs"].get(k) == v for c in chosen), (
                    e["kernel"],
                    k,
                    v,
                )
    assert len(chosen) < len(entries) / 4


@needs_sm100_compiler
def test_cover_compiles_for_sm100a(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    shards = 2
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "launch_manifest.py"),
                "--shard",
                f"{i}/{shards}",
                "--out",
                str(tmp_path / f"{i}.json"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(shards)
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    rows = [r for i in range(shards) for r in json.loads((tmp_path / f"{i}.json").read_text())]
    assert len(rows) == len(lm.cover(lm.load_manifest())), logs
    errors = [(r["entry"]["kernel"], r["error"]) for r in rows if "error" in r]
    assert not errors, errors
    for r in rows:
        e, c = r["entry"], r["entry"]["constexprs"]
        assert r["target"] == "sm_100a" and r["cubin_bytes"] > 0, e["kernel"]
        # programmatic dependent launch: griddepcontrol exactly when the launch asks for it
        assert (r["griddepcontrol"] > 0) == bool(c.get("PDL", False)), (
            e["kernel"],
            c.get("PDL"),
            r["griddepcontrol"],
        )
        assert r["wgmma"] == 0, e["kernel"]  # Hopper's MMA must not appear in Blackwell code
    kinds = {}
    for r in rows:
        kind = lm.mma_kind(r["entry"])
        if kind is None:
            continue
        kinds.setdefault(kind, 0)
        kinds[kind] += 1
        got = {"tcgen05": r["tcgen05"] > 0, "mma_sync": r["mma_sync"] > 0, "mx": r["block_scale"] > 0}
        want = {
            "tcgen05": kind.startswith("tcgen05"),
            "mma_sync": kind == "mma_sync",
            "mx": kind == "tcgen05_mx",
        }
        assert got == want, (r["entry"]["kernel"], r["entry"]["constexprs"], r["entry"]["options"], got)
    assert kinds.get("tcgen05_mx", 0) >= 2, kinds  # SM100's MX GEMM: e4m3 x e4m3 and e4m3 x e2m1
    assert kinds.get("tcgen05", 0) >= 3, (
        kinds
    )  # the cover compiles tensor-memory MMA tiles (GEMM FP8/FP4, indexer)


@needs_sm100_compiler
def test_the_sm90_fp8_mma_path_compiles_to_hopper_fp8_wgmma():
    """SM90's GEMM over FP8 activation codes (``_mx_gemm_kernel`` with ``MMA="fp8"``, ``cuda_sm100.fp8_mma``) compiled
    for ``sm_90a``: each recorded launch (dense and expert tiles, e4m3 and widened e2m1 weights) is an e4m3 x e4m3
    ``wgmma`` with float32 accumulation, no upcast to bf16."""
    code = (
        "import json, re, launch_manifest as lm\n"
        "rows = []\n"
        "for e in lm.load_manifest():\n"
        "    if e['kernel'] == '_mx_gemm_kernel' and e['constexprs'].get('MMA') == 'fp8':\n"
        "        ptx = lm.compile_entry(e, 90).asm['ptx']\n"
        "        rows.append(sorted(set(re.findall(r'wgmma\\.mma_async[\\w.]*', ptx))))\n"
        "print(json.dumps(rows))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) >= 4, rows  # dense e4m3 / e2m1, the gated up and the scattered down projections
    for kinds in rows:
        assert kinds and all(k.endswith(".f32.e4m3.e4m3") for k in kinds), kinds
