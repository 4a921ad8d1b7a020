#!/usr/bin/env bash
# One device call's worth of the standard H200 round, each part time-boxed so one slow part cannot eat the
# call's 600 s. The wheels in .whl (pydantic, transformers; ignored by git, so pass carry [".whl"]) go
# to /tmp/site first. Logs and JSON land in $OUT/<part>.
#   run (carry [".whl"]):  bash benchmarks/gpu/device_round.sh [parts...]
# parts (default: check slice gemm): check    every kernel against the reference (check.py)
#                                    slice    greedy equality + the slice at batch 1/16/64/256, ctx 4096, profile
#                                    nopdl    the slice at batch 1/16/64/256 with DEEPINFER_CUDA_SM100__PDL=0 (A/B)
#                                    noh2     the slice at batch 1/16 with DEEPINFER_CUDA_SM100__FP4_H2=0 (A/B)
#                                    finish   greedy + the slice at batch 1/16 with DEEPINFER_CUDA_SM100__SPLITK_FINISH=1 (A/B)
#                                    checkfin check.py with DEEPINFER_CUDA_SM100__SPLITK_FINISH=1
#                                    splitfin split-K finished in-kernel against the epilogue launch: equal, timed
#                                    gemm     decode GEMV tiles at one row, weights cold in L2
#                                    checksamp check.py's sampling section only, graphed_probs on
#                                    enghostab the V4 engine at batch 1/16, graphed_probs off / on twice each
#                                    engdp    the V4 engine at batch 1/16/64, device_plan off / on twice each
#                                    v41dp    the V4.1 slice at batch 1 and 16 (4k), device_plan off / on twice each,
#                                             greedy tokens kept (equal across the four runs)
#                                    checkattn check.py's attention section only
#                                    checkdense check.py's dense section only (the fused mHC checks among them)
#                                    nohc     the slice at batch 1/2 with DEEPINFER_CUDA_SM100__HC_FUSED=0 (A/B)
#                                    greedyhc greedy equality with DEEPINFER_CUDA_SM100__HC_FUSED=1
#                                    gemv41   V4.1-Flash's one-row GEMVs at their tiles and at variants (gemv_v41.py)
#                                    attntiles sparse-attention decode tiles over bf16, FP8 and V4.1 packed pools, graphed
#                                             (attention_tiles.py; kernel_resources.py finds the dispatched ones spilling)
#                                    checkprobs check.py's probs (the sort-free kernels beside the torch sorts) and sampling
#                                    probsab  the V4 engine at batch 1/16/64/256, radix_probs on, off, on (PROBSAB: other orders)
#                                    engine   greedy equality (overlap on by default) + LLM.generate on the slice vs
#                                             forward-only at batch 1/16/64/256, overlap off and on
#                                    v41tests the plugin's attention and dense kernel tests, compiled (V4.1's packed paths)
#                                    v41auto  V4.1 float32 greedy on the plugin with the trained cache, eager/graphs, DSpark
#                                    v41slice the V4.1-Flash-shaped slice, plain against DSpark k = 5, batch 1 (V41SLICE_ARGS)
#                                    v41prefill  the V4.1 slice's 8k prefill, plain and bounded replay, profiled
#                                    v41fp32  the V4.1 slice in float32 and DeepSeek's reference (carry .v41ref): greedy tokens
#                                    v41release the V4.1 slice with the release's FP8 activations (activation_quant
#                                             fp8): decode, 8k prefill, greedy tokens against DeepSeek's reference
#                                             in its release numerics (kvq_on; carry .v41ref)
#                                    fp8mma   the V4.1 slice's 8k prefill with the release's activations, SM90's FP8
#                                             wgmma path (cuda_sm100.fp8_mma) off / on twice each, then its GEMMs
#                                             against the reference (check.py act_quant with it on)
#                                    checkact check.py's act_quant section with the SM90 FP8 wgmma path on
#                                    v41ctx4k the V4.1 slice at batch 1, context 4k (shared prefix), three processes; the
#                                             first profiles its graph and lists its torch operators by caller (--op-sites)
#                                    v41nopdl the V4.1 slice at batch 1, context 4k, PDL off, profiled: each kernel's own
#                                             time (with PDL on, a kernel is charged its wait for the one before)
#                                             (V41_SLICE_EXPERTS=256 fits the slice on an H100)
#                                    v41ctx4kbig the V4.1 slice at batch 16/64/256, context 4k (shared prefix)
#                                    conformance the conformance kit on cuda_sm100 (CONFORMANCE_K: a -k filter)
#                                    enghost  the V4 engine at batch 1, overlapped: cProfile and CUDA API calls per step
#                                    v41ctx32k the V4.1 slice at batch 1/16, context 32k (shared prefix)
#                                    sidediag V4.1's site coefficients on a side stream (hc_side_coeffs): side_coeffs_diff.py
#                                             (one entry, then a chain of 16); float32 greedy against DeepSeek's goldens
#                                             one sequence at a time (the fused boundary's path), side on then off;
#                                             then the slice's greedy tokens at batch 1 (4k), side off / on x PDL on / off
#                                    sideeager the slice's tokens eager (v41_slice.py --eager), side off / on
#                                    fp8var   V4's FP8 KV attention loop with each part of the tile's decode taken out
#                                             (fp8_kv_variants.py, T = 64 and 16: where the FP8 decode loses)
#                                    v41var   the same for V4.1's packed entries (v41_kv_variants.py: the window's e4m3 and
#                                             the compressed e2m1 entries, T = 64 and 16)
#                                    abhc     the slice at batch 1/2 twice each way, alternating: fused mHC
#                                             boundary off, on (the first on run profiled)
#                                    splitwave the 64-head attention tiles (and bf16's 32 x 64) with split-KV chunks
#                                             rounded up (dispatch) and down (whole waves), T = 16 / 64 / 256
#                                    probsprof each launch of the sampler's probs at 1 / 64 / 256 rows, PDL off, probs_compact_first off / on
#                                    attndisp the dispatched attention tiles (and bf16's old 32 x 64), split as dispatched
#                                    v4greedy V4's greedy equality alone (float32, bf16, the FP8 KV cache)
#                                    ropeapart V4's greedy equality and the slice over the FP8 KV cache with
#                                             DEEPINFER_CUDA_SM100__FP8_KV_ROPE_APART=1, then the slice with it off (A/B)
#                                    b1cap    the V4 engine at batch 1 with max_num_seqs 1, 16, 256, twice, alternating
#                                    pexperts the prefill GEMMs at 8,192 rows: FP4 expert tiles (swap_ab among them) against
#                                             torch._grouped_mm, the FP8 linears on Triton / dequantised on cuBLAS by rows
#                                             (gemm_kernels.py prefill_experts prefill_dense), then check.py's dequant section
#                                    fp4bk    V4's 8k prefill by DEEPINFER_CUDA_SM100__FP4_PREFILL_BLOCK_K, 64 and 128 three
#                                             times each, alternating (FP4BK: the list)
#                                    prefab   V4's 8k prefill with the dispatched tiles (the first run profiled), with mHC's
#                                             old mixes tiles, with the bf16 attention at 4 warps, three times each,
#                                             alternating (PREFAB: the list; v4_slice.py --prefill-tiles)
#                                    perlayer V4's slice at batch 1 (4k) with 4 and 8 layers, three times each, alternating:
#                                             a layer's time and bytes from the difference (per_layer.py), the head out
#                                    sideab   V4's slice at batch 1 (4k), 4 and 8 layers, hc_side_coeffs off / on, three
#                                             rounds: per_layer.py for each
#                                    engside  the V4 engine (LLM.generate) at batch 1/16, hc_side_coeffs on / off three
#                                             times each, alternating (ENGSIDE: the list)
#                                    checkplan check.py's static plan: the kernels against the torch composition, graphed
#                                    dpab     the V4 engine at batch 1/16, device_plan off / on three times each, alternating
#                                             (the plan in the decode graph: kernels.static_plan's three launches)
#                                    dequantab V4's 8k prefill by DEEPINFER_CUDA_SM100__DEQUANT_GEMM_ROWS : PREFILL_SWAP_AB,
#                                             0:0 1024:0 1024:1 twice (DEQUANTAB: the list; the first 1024:1 profiled)
set -u
OUT=${OUT:-/tmp/out}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:.:plugins/deepinfer_cuda_sm100:plugins/deepinfer_structured:plugins/deepinfer_spec_decode
slice_args=(--batches 1 16 64 256 --contexts 4096 --prefill 0)
for part in "${@:-check slice gemm}"; do
  for p in $part; do
    mkdir -p "$OUT/$p"
    case $p in
      check) cmd=(timeout 150 python3 benchmarks/gpu/check.py --out "$OUT/check") ;;
      slice) cmd=(timeout 260 python3 benchmarks/gpu/v4_slice.py --sections greedy slice "${slice_args[@]}" --profile 1
                  --out "$OUT/slice") ;;
      nopdl) cmd=(env DEEPINFER_CUDA_SM100__PDL=0 timeout 100 python3 benchmarks/gpu/v4_slice.py --sections slice "${slice_args[@]}"
                  --out "$OUT/nopdl") ;;
      noh2) cmd=(env DEEPINFER_CUDA_SM100__FP4_H2=0 timeout 60 python3 benchmarks/gpu/v4_slice.py --sections slice --batches 1 16
                 --contexts 4096 --prefill 0 --out "$OUT/noh2") ;;
      finish) cmd=(env DEEPINFER_CUDA_SM100__SPLITK_FINISH=1 timeout 200 python3 benchmarks/gpu/v4_slice.py --sections greedy slice
                   --batches 1 16 --contexts 4096 --prefill 0 --profile 1 --out "$OUT/finish") ;;
      checksamp) cmd=(env DEEPINFER_CUDA_SM100__GRAPHED_PROBS=1 timeout 120 python3 benchmarks/gpu/check.py --only sampling
                      --out "$OUT/checksamp") ;;
      enghostab) cmd=(bash -c 'for v in 0 1 0 1; do echo "-- DEEPINFER_CUDA_SM100__GRAPHED_PROBS=$v"; d="$0/probs${v}_$(date +%s)"; mkdir -p "$d"
                      DEEPINFER_CUDA_SM100__GRAPHED_PROBS=$v timeout 140 python3 benchmarks/gpu/v4_slice.py --sections engine \
                      --batches 1 16 --engine-prompt 64 --engine-tokens 128 --out "$d"; done' "$OUT/enghostab") ;;
      gemv41) cmd=(timeout 300 python3 benchmarks/gpu/gemv_v41.py --out "$OUT/gemv41") ;;
      attntiles) cmd=(timeout 300 python3 benchmarks/gpu/attention_tiles.py --out "$OUT/attntiles") ;;
      checkprobs) cmd=(timeout 150 python3 benchmarks/gpu/check.py --only probs,sampling --out "$OUT/checkprobs") ;;
      probsab) cmd=(bash -c 'for v in ${PROBSAB:-1 0 1}; do echo "-- DEEPINFER_CUDA_SM100__RADIX_PROBS=$v"; d="$0/radix${v}_$(date +%s)"
                    mkdir -p "$d"; DEEPINFER_CUDA_SM100__RADIX_PROBS=$v timeout 260 python3 benchmarks/gpu/v4_slice.py \
                    --sections engine --batches 1 16 64 256 --engine-prompt 64 --engine-tokens 128 --out "$d"; done' \
                    "$OUT/probsab") ;;
      engdp) cmd=(bash -c 'for v in 0 1 0 1; do echo "-- device_plan=$v"; d="$0/dp${v}_$(date +%s)"; mkdir -p "$d"
                  flag=(--device-plan "$v"); timeout 140 python3 benchmarks/gpu/v4_slice.py --sections engine \
                  --batches 1 16 64 --engine-prompt 64 --engine-tokens 128 "${flag[@]}" --out "$d"; done' "$OUT/engdp") ;;
      checkplan) cmd=(timeout 120 python3 benchmarks/gpu/check.py --only plan --out "$OUT/checkplan") ;;
      dpab) cmd=(bash -c 'for v in ${DPAB:-0 1 0 1 0 1}; do echo "-- device_plan=$v"; d="$0/dp${v}_$RANDOM"; mkdir -p "$d"
                 flag=(--device-plan "$v"); timeout 100 python3 benchmarks/gpu/v4_slice.py --sections engine \
                 --batches 1 16 --engine-prompt 64 --engine-tokens 128 "${flag[@]}" --out "$d"; done' "$OUT/dpab") ;;
      v41dp) cmd=(bash -c 'for v in 0 1 0 1; do echo "-- device_plan=$v"; d="$0/dp${v}_$(date +%s)"; mkdir -p "$d"
                  flag=(--device-plan "$v"); timeout 110 python3 benchmarks/gpu/v41_slice.py --batches 1 16 \
                  --ks 0 --tokens 16 --prompt 4096 --shared-prefix 4080 --save-tokens "${flag[@]}" --out "$d"; done' "$OUT/v41dp") ;;
      checkattn) cmd=(timeout 150 python3 benchmarks/gpu/check.py --only attention --out "$OUT/checkattn") ;;
      checkdense) cmd=(timeout 120 python3 benchmarks/gpu/check.py --only dense --out "$OUT/checkdense") ;;
      greedyhc) cmd=(env DEEPINFER_CUDA_SM100__HC_FUSED=1 timeout 160 python3 benchmarks/gpu/v4_slice.py --sections greedy
                     --batches 1 --contexts 4096 --prefill 0 --out "$OUT/greedyhc") ;;
      nohc) cmd=(env DEEPINFER_CUDA_SM100__HC_FUSED=0 timeout 60 python3 benchmarks/gpu/v4_slice.py --sections slice --batches 1 2
                 --contexts 4096 --prefill 0 --out "$OUT/nohc") ;;
      abhc) cmd=(bash -c 'for r in 1 2; do for v in 0 1; do prof=(); [ "$v$r" = 11 ] && prof=(--profile 1)
                   echo "-- DEEPINFER_CUDA_SM100__HC_FUSED=$v run $r"; DEEPINFER_CUDA_SM100__HC_FUSED=$v timeout 45 python3 benchmarks/gpu/v4_slice.py \
                   --sections slice --batches 1 2 --contexts 4096 --prefill 0 "${prof[@]}" --out "$0/hc_${v/:/x}_$r"; done; done
                   ' "$OUT/abhc") ;;
      engine) cmd=(timeout 560 python3 benchmarks/gpu/v4_slice.py --sections greedy engine --batches 1 16 64 256
                   --engine-prompt 64 --engine-tokens 128 --out "$OUT/engine") ;;
      v41tests) cmd=(timeout 170 python3 -m pytest -q -p no:cacheprovider tests/plugins/cuda_sm100/test_kernels_attention.py
                     tests/plugins/cuda_sm100/test_kernels_fp8_kv.py tests/plugins/cuda_sm100/test_kernels_v41_packed.py
                     tests/plugins/cuda_sm100/test_kernels_dense.py) ;;
      v41auto) cmd=(timeout 150 python3 benchmarks/gpu/v41_greedy.py --configs reindex_r2 --kv auto --modes eager graphs
                    --dspark 3 --out "$OUT/v41auto") ;;
      v41slice) cmd=(timeout "${V41SLICE_TIMEOUT:-300}" python3 benchmarks/gpu/v41_slice.py ${V41SLICE_ARGS:---batches 1 --ks 5 --tokens 32}
                     --out "$OUT/v41slice_$(date +%s)") ;;
      v41prefill) cmd=(timeout 110 python3 benchmarks/gpu/v41_slice.py --batches --prefill 8192 --profile-prefill
                       --out "$OUT/v41prefill") ;;
      v41fp32) cmd=(bash -c 'timeout 300 python3 benchmarks/gpu/v41_slice.py --float32 --batches 1 --ks 0 --tokens 32 \
                   --save-tokens --out "$0/eng" && timeout 90 python3 benchmarks/gpu/v41_reference_peer.py --float32 \
                   --modes kvq_only --batches 1 --tokens 32 --engine-json "$0/eng/v41_slice.json" --out "$0/ref"' \
                   "$OUT/v41fp32") ;;
      v41release) cmd=(bash -c 'timeout 150 python3 benchmarks/gpu/v41_slice.py --activation-quant fp8 --batches 1 32 --ks 0 \
                      --tokens 32 --save-tokens --prefill 8192 --out "$0/eng" && timeout 200 python3 \
                      benchmarks/gpu/v41_reference_peer.py --modes kvq_on --batches 1 32 --tokens 32 \
                      --engine-json "$0/eng/v41_slice.json" --out "$0/ref"' "$OUT/v41release") ;;
      fp8mma) cmd=(bash -c 'for v in 0 1 0 1; do DEEPINFER_CUDA_SM100__FP8_MMA=$v timeout 100 python3 benchmarks/gpu/v41_slice.py \
                  --activation-quant fp8 --batches --prefill 8192 --out "$0/prefill_fp8mma${v}_$(date +%s)"; done; \
                  DEEPINFER_CUDA_SM100__FP8_MMA=1 timeout 150 python3 benchmarks/gpu/check.py --only act_quant \
                  --out "$0/check"' "$OUT/fp8mma") ;;
      checkact) cmd=(env DEEPINFER_CUDA_SM100__FP8_MMA=1 timeout 150 python3 benchmarks/gpu/check.py --only act_quant
                     --out "$OUT/checkact") ;;
      v41ctx4k) cmd=(bash -c 'for r in 1 2 3; do prof=(); t=100; [ $r = 1 ] && prof=(--profile 1 --op-sites 1) t=300; mkdir -p "$0/b1_$r"
                     timeout $t python3 benchmarks/gpu/v41_slice.py --batches 1 --ks 0 --tokens 16 --prompt 4096 \
                     --shared-prefix 4080 "${prof[@]}" --out "$0/b1_$r"; done' "$OUT/v41ctx4k") ;;
      v41nopdl) cmd=(env DEEPINFER_CUDA_SM100__PDL=0 timeout 200 python3 benchmarks/gpu/v41_slice.py --batches 1 --ks 0
                     --tokens 16 --prompt 4096 --shared-prefix 4080 --profile 1 --out "$OUT/v41nopdl") ;;
      v41ctx4kbig) cmd=(timeout 280 python3 benchmarks/gpu/v41_slice.py --batches 16 64 256 --ks 0 --tokens 16 --prompt 4096
                     --shared-prefix 4080 --out "$OUT/v41ctx4kbig") ;;
      enghost) cmd=(timeout 200 python3 benchmarks/gpu/v4_slice.py --sections engine --batches 1 16 --engine-prompt 64
                    --engine-tokens 128 --engine-host-profile --out "$OUT/enghost") ;;
      v41ctx32k) cmd=(timeout 150 python3 benchmarks/gpu/v41_slice.py --batches 1 16 --ks 0 --tokens 16 --prompt 32768
                      --shared-prefix 32752 --out "$OUT/v41ctx32k") ;;
      sidediag) cmd=(bash -c '[ -n "${SIDE_RUNS:-}" ] || { timeout 120 python3 benchmarks/gpu/side_coeffs_diff.py; for v in 1 0; do \
                     DEEPINFER_CUDA_SM100__HC_SIDE_COEFFS=$v timeout 100 python3 benchmarks/gpu/v41_greedy.py --configs flash_mini \
                     --modes graphs --max-num-seqs 1 | sed "s/^/side=$v f32 /" | cut -c1-200; done; }; SIDE_RUNS=${SIDE_RUNS:-"0 1;1 1;0 0;1 0"}; \
                     IFS=";"; for cfg in $SIDE_RUNS; do IFS=" "; set -- $cfg; d="$0/side$1_pdl$2_$RANDOM"; DEEPINFER_CUDA_SM100__HC_SIDE_COEFFS=$1 \
                     DEEPINFER_CUDA_SM100__PDL=$2 timeout 120 python3 benchmarks/gpu/v41_slice.py --batches 1 --ks 0 --tokens 16 \
                     --prompt 4096 --shared-prefix 4080 --save-tokens "${@:3}" --out "$d" > "$d.log" 2>&1; \
                     echo "side=$1 pdl=$2 ${*:3} rc $?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(\"tokens\", d.get(\"tokens\"))" "$d/v41_slice.json"; \
                     done' "$OUT/sidediag") ;;
      sideeager) cmd=(env SIDE_RUNS="0 1 --eager;1 1 --eager" bash benchmarks/gpu/device_round.sh sidediag) ;;
      fp8var) cmd=(timeout 300 python3 benchmarks/gpu/fp8_kv_variants.py --tokens 64 16 --out "$OUT/fp8var") ;;
      v41var) cmd=(timeout 300 python3 benchmarks/gpu/v41_kv_variants.py --tokens 64 16 --out "$OUT/v41var") ;;
      splitwave) cmd=(timeout 240 python3 benchmarks/gpu/attention_tiles.py --tiles 64,32,8,1 64,32,8,2 32,64,8,2
                      --tokens 16 64 256 --split-rules ceil floor --out "$OUT/splitwave") ;;
      probsprof) cmd=(bash -c 'for v in ${PROBSFIRST:-0 1}; do echo "-- PROBS_COMPACT_FIRST=$v"; DEEPINFER_CUDA_SM100__PDL=0 \
                      DEEPINFER_CUDA_SM100__PROBS_COMPACT_FIRST=$v timeout 100 python3 benchmarks/gpu/probs_profile.py \
                      --out "$0/first$v"; done' "$OUT/probsprof") ;;
      attndisp) cmd=(timeout 150 python3 benchmarks/gpu/attention_tiles.py --tiles 16,32,8,2 64,32,8,2 64,32,8,1 32,64,8,2
                     --tokens 1 16 64 256 --out "$OUT/attndisp") ;;
      ropeapart) cmd=(bash -c 'for v in 1 0; do sec=slice; [ $v = 1 ] && sec="greedy slice"; echo "-- FP8_KV_ROPE_APART=$v"
                      DEEPINFER_CUDA_SM100__FP8_KV_ROPE_APART=$v timeout 200 python3 benchmarks/gpu/v4_slice.py --sections $sec \
                      --batches 1 16 64 256 --contexts 4096 --prefill 0 --kv-cache-dtype fp8 --out "$0/rope$v"; done' "$OUT/ropeapart") ;;
      b1cap) cmd=(bash -c 'for m in ${B1CAP:-1 16 256 1 16 256}; do echo "-- max_num_seqs=$m"; d="$0/m${m}_$RANDOM"; mkdir -p "$d"
                  timeout 90 python3 benchmarks/gpu/v4_slice.py --sections engine --batches 1 --engine-prompt 64 \
                  --engine-tokens 128 --engine-max-seqs $m --out "$d"; done' "$OUT/b1cap") ;;
      pexperts) cmd=(bash -c 'R=$PWD; export PYTHONPATH=/tmp/site:$R:$R/plugins/deepinfer_cuda_sm100; cd benchmarks/gpu
                     timeout 330 python3 gemm_kernels.py --sections prefill_experts prefill_dense --out "$0"
                     timeout 100 python3 check.py --only dequant --out "$0"' "$OUT/pexperts") ;;
      dequantab) cmd=(bash -c 'seen=; for v in ${DEQUANTAB:-0:0 1024:0 1024:1 0:0 1024:0 1024:1}; do rows=${v%:*}; swap=${v#*:}
                      prof=(); [ "$v" = 1024:1 ] && [ -z "$seen" ] && prof=(--profile-prefill) && seen=1
                      echo "-- DEQUANT_GEMM_ROWS=$rows PREFILL_SWAP_AB=$swap"; DEEPINFER_CUDA_SM100__DEQUANT_GEMM_ROWS=$rows \
                      DEEPINFER_CUDA_SM100__PREFILL_SWAP_AB=$swap timeout 100 python3 benchmarks/gpu/v4_slice.py --sections slice \
                      --batches 1 --contexts 4096 --prefill 8192 "${prof[@]}" --out "$0/r${rows}s${swap}_$RANDOM"; done' "$OUT/dequantab") ;;
      fp4bk) cmd=(bash -c 'for v in ${FP4BK:-64 128 64 128 64 128}; do echo "-- FP4_PREFILL_BLOCK_K=$v"
                  DEEPINFER_CUDA_SM100__FP4_PREFILL_BLOCK_K=$v timeout 100 python3 benchmarks/gpu/v4_slice.py --sections slice \
                  --batches 1 --contexts 4096 --prefill 8192 --out "$0/bk${v}_$RANDOM"; done' "$OUT/fp4bk") ;;
      prefab) cmd=(bash -c 'seen=; for v in ${PREFAB:-base mixes:old attn:32,64,4,2 base mixes:old attn:32,64,4,2 base mixes:old attn:32,64,4,2}
                   do prof=(); [ "$v" = base ] && [ -z "$seen" ] && prof=(--profile-prefill) && seen=1; t=""; [ "$v" = base ] || t=$v
                   echo "-- PREFILL_TILES=$v"; timeout 100 python3 benchmarks/gpu/v4_slice.py --sections slice --batches 1 \
                   --contexts 4096 --prefill 8192 --prefill-tiles "$t" "${prof[@]}" --out "$0/${v//[:,]/_}_$RANDOM"; done' "$OUT/prefab") ;;
      perlayer) cmd=(bash -c 'for n in ${PERLAYER:-4 8 4 8 4 8}; do echo "-- LAYERS=$n"; timeout 100 python3 benchmarks/gpu/v4_slice.py \
                     --sections slice --layers $n --batches 1 --contexts 4096 --prefill 0 --out "$0/l${n}_$RANDOM"; done
                     python3 benchmarks/gpu/per_layer.py "$0"/l*/v4_slice.json' "$OUT/perlayer") ;;
      sideab) cmd=(bash -c 'for r in 1 2 3; do for v in 0 1; do for n in 4 8; do echo "-- HC_SIDE_COEFFS=$v LAYERS=$n"
                   DEEPINFER_CUDA_SM100__HC_SIDE_COEFFS=$v timeout 100 python3 benchmarks/gpu/v4_slice.py --sections slice \
                   --layers $n --batches 1 --contexts 4096 --prefill 0 --out "$0/s${v}_l${n}_$RANDOM"; done; done; done
                   for v in 0 1; do echo "-- per layer, HC_SIDE_COEFFS=$v"; python3 benchmarks/gpu/per_layer.py "$0"/s${v}_*/v4_slice.json; done' \
                   "$OUT/sideab") ;;
      engside) cmd=(bash -c 'for v in ${ENGSIDE:-1 0 1 0 1 0}; do echo "-- HC_SIDE_COEFFS=$v"; DEEPINFER_CUDA_SM100__HC_SIDE_COEFFS=$v \
                    timeout 120 python3 benchmarks/gpu/v4_slice.py --sections engine --batches 1 16 --engine-prompt 64 \
                    --engine-tokens 128 --out "$0/s${v}_$RANDOM"; done' "$OUT/engside") ;;
      v4greedy) cmd=(timeout 200 python3 benchmarks/gpu/v4_slice.py --sections greedy --out "$OUT/v4greedy") ;;
      conformance) cmd=(timeout 240 python3 -m pytest -q -p no:cacheprovider -p deepinfer_core.testing.pytest_plugin
                        --pyargs deepinfer_core.testing --deepinfer-backend cuda_sm100
                        --deepinfer-extra-plugin deepinfer_cuda_sm100.plugin ${CONFORMANCE_K:+-k "$CONFORMANCE_K"}) ;;
      splitfin) cmd=(timeout 120 python3 benchmarks/gpu/check_split_finish.py --out "$OUT/splitfin") ;;
      checkfin) cmd=(env DEEPINFER_CUDA_SM100__SPLITK_FINISH=1 timeout 150 python3 benchmarks/gpu/check.py --out "$OUT/checkfin") ;;
      gemm) cmd=(timeout 120 python3 benchmarks/gpu/gemm_kernels.py --sections decode_dense decode_experts decode_shared --rows 1
                 --out "$OUT/gemm") ;;
      *) echo "unknown part $p"; exit 2 ;;
    esac
    start=$(date +%s); n=$(( ${n:-0} + 1 )); log="$OUT/$n-$p.log"
    "${cmd[@]}" > "$log" 2>&1
    echo "== $p: rc $? in $(( $(date +%s) - start )) s"
    grep -h "^side=\|^tokens \|^D=\|^chain\|^engine host\|^v41 engine\|^v41 graph\|^v41 prefill\|^reference\|passes\|passed\|failed\|^engine\|^-- DEEPINFER\|tokens_equal\|graph_ms\|kernel time\|FAILED\|PASSED\|EQUAL\|equal_calls\|Traceback\|Error" "$log" | cut -c1-240 | head -30
  done
done
