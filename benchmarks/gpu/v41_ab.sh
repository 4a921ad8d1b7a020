#!/usr/bin/env bash
# The V4.1 slice at batch 1, context 4k, this tree against an older one in one device call, alternating
# (new profiled and listing its torch operators first; it compiles), then float32 greedy equality on the V4 slice.
# Make the older tree (git-ignored; add /.old/ to .git/info/exclude) and carry it:
#   rm -rf .old && mkdir .old && git archive <commit> deepinfer_core plugins benchmarks | tar -x -C .old \
#     --exclude='*.safetensors' --exclude='benchmarks/gpu/runs' && cp benchmarks/gpu/slice_model41.py .old/benchmarks/gpu/
#   run (carry [".whl", ".old"]):  bash benchmarks/gpu/v41_ab.sh [.old]
#   V41AB_X="DEEPINFER_CUDA_SM100__NAME=1": new, old, this tree with that setting (profiled), new, with it again
# On a card under 100 GB (an H100) the slice routes over 256 experts (V41_SLICE_EXPERTS): a batch-1 step reads six
# experts a layer either way. Logs and JSON land in $OUT/<tag>.
set -u
OUT=${OUT:-/tmp/out}
OLD=${1:-.old}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ "$mem" -lt 100000 ] && export V41_SLICE_EXPERTS=256 && echo "V41_SLICE_EXPERTS=256"
args=(--batches 1 --ks 0 --tokens 16 --prompt 4096 --shared-prefix 4080)
run() {  # tree tag timeout extra...
  local tree=$1 tag=$2 t=$3; shift 3
  mkdir -p "$OUT/$tag"; echo "== $tag $(date +%T)"
  (cd "$tree" && PYTHONPATH=/tmp/site:.:plugins/deepinfer_cuda_sm100:plugins/deepinfer_spec_decode:plugins/deepinfer_structured timeout "$t" python3 benchmarks/gpu/v41_slice.py \
     "${args[@]}" "$@" --out "$OUT/$tag" > "$OUT/$tag/log.txt" 2>&1); echo "rc $?"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["engine"]["rows"][0]; l=r.get("layers",{}); print({k: l.get(k) for k in ("graph_ms","head_ms","ms_per_layer","share")}, r["plain"])' "$OUT/$tag/v41_slice.json" || tail -5 "$OUT/$tag/log.txt"
}
if [ -n "${V41AB_X:-}" ]; then  # a third arm: this tree with the settings in V41AB_X (e.g. DEEPINFER_CUDA_SM100__X=1)
  run . new_1 280 --profile 1 --op-sites 1 --save-tokens
  run "$OLD" old_1 200 --save-tokens
  (export $V41AB_X; run . x_1 100 --profile 1 --save-tokens)
  run . new_2 100 --save-tokens
  (export $V41AB_X; run . x_2 100 --save-tokens)
  python3 -c 'import json,sys; t=[json.load(open(f"{sys.argv[1]}/{k}/v41_slice.json")).get("tokens") for k in ("new_1","old_1","x_1","new_2","x_2")]; print("greedy tokens equal across the five runs:", all(x == t[0] for x in t), t[0] is not None)' "$OUT"
  exit 0
fi
run . new_1 280 --profile 1 --op-sites 1
run "$OLD" old_1 200
run . new_2 100
run "$OLD" old_2 100
echo "== greedy $(date +%T)"; mkdir -p "$OUT/greedy"
PYTHONPATH=/tmp/site:.:plugins/deepinfer_cuda_sm100:plugins/deepinfer_spec_decode:plugins/deepinfer_structured timeout 150 python3 benchmarks/gpu/v4_slice.py --sections greedy \
  --out "$OUT/greedy" > "$OUT/greedy/log.txt" 2>&1; echo "rc $?"; grep -i "greedy\|equal\|mismatch" "$OUT/greedy/log.txt" | tail -5
