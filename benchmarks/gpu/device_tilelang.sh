#!/usr/bin/env bash
# TileLang (and pydantic, transformers) on the device machine, in two `run` calls on one warm machine:
# the TileLang 0.1.15 tree (+ tvm-ffi 0.1.12, z3, torch-c-dlpack-ext) for Python 3.12 is one 42 MB
# tar.xz, and with the tracked tree (34 MB, the demo checkpoints) it only fits the 64 MiB carry in two halves.
#   here, once:  bash benchmarks/gpu/device_tilelang.sh pack    (needs ../shared/tools/tilelang-carry.sh's .tl1 .tl2 and .whl)
#   run 1 (carry [".tla"]):  bash benchmarks/gpu/device_tilelang.sh part1
#   run 2 (carry [".tlb"]), before the machine goes idle:  source benchmarks/gpu/device_tilelang.sh part2 && python ...
set -e
case "$1" in
pack)
  rm -rf /tmp/tlsite312 .tla .tlb && mkdir -p /tmp/tlsite312 .tla .tlb
  for w in .tl1/*.whl .tl2/*.whl; do python -m zipfile -e "$w" /tmp/tlsite312/; done
  find /tmp/tlsite312 -name __pycache__ -prune -exec rm -rf {} +
  rm -rf /tmp/tlsite312/tilelang/3rdparty/cutlass/tools /tmp/tlsite312/tilelang/3rdparty/tvm/src
  XZ_OPT="-9 -T4" tar -cJf /tmp/tlsite312.tar.xz -C /tmp/tlsite312 .
  split -b 31000000 -d /tmp/tlsite312.tar.xz .tla/tlpart && mv .tla/tlpart01 .tlb/
  cp .whl/pydantic* .whl/annotated* .whl/typing_inspection* .whl/transformers* .tlb/
  for d in .tla .tlb; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
  du -sh .tla .tlb ;;
part1)
  mkdir -p /tmp/tlparts && cp .tla/tlpart00 /tmp/tlparts/ && ls -la /tmp/tlparts ;;
part2)
  mkdir -p /tmp/tlsite /tmp/site
  cat /tmp/tlparts/tlpart00 .tlb/tlpart01 | tar -xJ -C /tmp/tlsite
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .tlb/*.whl
  export PYTHONPATH=/tmp/site:/tmp/tlsite:.:plugins/deepinfer_cuda_sm100:plugins/deepinfer_structured
  python3 -c "import tilelang; print('tilelang', tilelang.__version__)" ;;
esac
