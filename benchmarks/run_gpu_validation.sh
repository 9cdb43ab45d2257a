#!/usr/bin/env bash
# The GPU validation of issue-sized claims, run from the repo root on an H100/H200 with CuTe DSL on
# PYTHONPATH:  bash benchmarks/run_gpu_validation.sh PART  (the parts below, or all)
# Parts fit one 10-minute device call each and append to the same results directory (/tmp/gpu-results,
# kept while the machine is warm); every part rewrites one JSON summary naming the card
# (benchmarks/gpu_validation_summary.py) and copies it, with the log, to $OUT.
#   tests     pytest -m "(gpu or sm90) and not parity" (206 tests, 120 s alone on an H100, 2026-12-07)
#   parity-zoo / parity-rest: pytest -m parity in two calls, the bug-zoo file and the rest (the whole
#             marker took over 540 s on an H100: 84 of 92 tests); junit XML counted
#   verdicts  first_token chat+thinking on cutedsl_sm90 (bug-budget column = exact audit), parity.audit run,
#             a 300-token teacher-forced decode with every call audited, CUDA-graph decode vs eager
#   dspark    DSpark draft parity on cutedsl_sm90, chat and thinking (each must finish in 3 min), over
#             DSV4_DSPARK_RANKS torchrun ranks sharing the GPU (default 15: units of (column, part, prompt), sharded.py)
#   zoo       the bug zoo's kernel faults injected around the real sm_90a kernels + clean row, and the
#             audit's cost beside the plain forward (benchmarks/bench_audit.py)
#   gate      tests beside verdicts + zoo (two processes share the GPU), in one call: the check before a
#             routing or kernel change lands (about 350 s on an H200: tests 216 s beside verdicts 257 s + zoo 92 s)
#   parity    parity-zoo and parity-rest side by side (two processes share the GPU well: on an H100 the
#             tests and verdicts parts ran side by side in 165 s and 250 s)
#   realwidth-flash / realwidth-pro: benchmarks/bench_real_width.py at the exact shapes (one call each;
#             DSV4_RW_BUDGET seconds, default 500; the JSON goes to $OUT, then
#             benchmarks/real_width_table.py makes reports/real_width.md)
#   decode    benchmarks/bench_decode_graphs.py on tiny and medium: eager vs CUDA-graph decode step, against the
#             summed device time (the 3x target), where an eager step goes by piece kind
#   realwidth-8k: bench_real_width.py on 3 Flash layers at an 8,192-token prefill, harness included, then decode
#             after the biggest cache up to 32k that fits the budget (one call)
#   flatness  bench_real_width.py on 8 real-width Flash layers, the streaming reference only: its peak memory
#             after layer 2 against after layer 8
#   shapes    benchmarks/bench_nvfp4_shapes.py: every Flash / Pro GEMM shape, M 1..4096, NVFP4 vs cuBLAS BF16
#             (DSV4_SHAPES_MODELS, default flash,pro; DSV4_SHAPES_BUDGET s, default 470; one call)
#   prefill   the prefill route's GPU tests (PrefillGemm: exact BF16 dequantization + cuBLAS), then
#             bench_nvfp4_shapes.py at M 64, 128, 256, 512, 1024, 4096 (the route timed beside the generic
#             kernel and BF16, so its threshold is read from one run)
#   bankload  benchmarks/bench_bank_load.py: a Flash routed w13 bank loaded to the GPU the old way (every expert
#             read, then stacked) beside bank_fill.py's (each written into its slot): time, host and device peak
#   streamed  benchmarks/bench_streamed.py: a streamed native model beside the whole one (prefill; a decode step by
#             step and layer by layer), on cutedsl_sm90
#   kernel-profile: the sm_90a decode GEMM's own tests, its controlled variants
#             (benchmarks/profile_sm90_decode_gemm.py) and Nsight Compute sections of its launches
set -u
PART=${1:-all}
RES=/tmp/gpu-results
mkdir -p "$RES"
export PYTHONUNBUFFERED=1 DSV4_PARITY_CACHE=/tmp/dsv4-cache PYTHONPATH=${PYTHONPATH:-}:$PWD
# step NAME LIMIT CMD...: runs CMD under a time limit, logs it, appends {name, rc, seconds} to steps.jsonl
step() {
  local name=$1 t=$2; shift 2
  echo "=== $name: $* (limit ${t}s)"
  local t0=$SECONDS
  timeout "$t" "$@"
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0))s"
  printf '{"name": "%s", "rc": %d, "seconds": %d, "limit": %d}\n' "$name" "$rc" "$((SECONDS - t0))" "$t" >> "$RES/steps.jsonl"
}
run_part() {
  case "$1" in
  tests)   # the kernel and GPU tests; the parity suite is the next part (together they ran over 330 s on an H100)
    step pytest_gpu 540 python3 -m pytest -q -rs -p no:cacheprovider -m "(gpu or sm90) and not parity" \
        --junitxml="$RES/pytest_gpu.xml" ;;
  parity-zoo)
    step pytest_parity_zoo 540 python3 -m pytest -q -rs -p no:cacheprovider -m "parity" tests/parity/test_bugzoo.py \
        --junitxml="$RES/pytest_parity_zoo.xml" ;;
  parity-rest)
    step pytest_parity_rest 540 python3 -m pytest -q -rs -p no:cacheprovider -m "parity" \
        --deselect tests/parity/test_bugzoo.py --junitxml="$RES/pytest_parity_rest.xml" ;;
  verdicts)
    step first_token_chat 120 python3 -m parity.first_token --mode chat --device cuda --backend cutedsl_sm90 \
        --json "$RES/first_token_chat.json"
    step first_token_thinking 120 python3 -m parity.first_token --mode thinking --device cuda --backend cutedsl_sm90 \
        --json "$RES/first_token_thinking.json"
    step audit_run 90 python3 -m parity.audit run --device cuda --backend cutedsl_sm90 --json "$RES/audit_run.json"
    # one prompt: every eager step's ~15 calls are replayed through the oracle (~0.4 s a step on an H100)
    step decode300_audited 240 python3 -m parity.decode --teacher-forced --tokens 300 --prompt chat-capital \
        --device cuda --backend cutedsl_sm90 --json "$RES/decode300.json"
    step decode_graphs 90 python3 -m parity.decode --teacher-forced --tokens 64 --prompt chat-capital --device cuda \
        --backend cutedsl_sm90 --graphs --json "$RES/decode64_graphs.json" ;;
  dspark)
    step dspark_chat 180 python3 -m torch.distributed.run --standalone --nproc-per-node "${DSV4_DSPARK_RANKS:-15}" \
        -m parity.dspark --mode chat --device cuda --backend cutedsl_sm90 --json "$RES/dspark_chat.json"
    step dspark_thinking 180 python3 -m torch.distributed.run --standalone --nproc-per-node "${DSV4_DSPARK_RANKS:-15}" \
        -m parity.dspark --mode thinking --device cuda --backend cutedsl_sm90 --json "$RES/dspark_thinking.json" ;;
  zoo)
    step zoo_kernel_faults 300 python3 -m parity.bugzoo --device cuda --backend cutedsl_sm90 \
        --fault kernel_weight_scale_neighbour --fault kernel_ktail_tile_dropped --fault kernel_tile_row_unwritten \
        --fault kernel_act_scale_1_in_64 --fault kernel_alpha_of_next_expert --json "$RES/zoo_kernel_faults.json"
    step bench_audit 120 python3 benchmarks/bench_audit.py --checkpoint tiny-trained --backend cutedsl_sm90 \
        --device cuda --json "$RES/bench_audit.json" ;;
  parity)
    run_part parity-zoo & run_part parity-rest & wait ;;
  gate)
    run_part tests & { run_part verdicts; run_part zoo; } & wait ;;
  realwidth-flash|realwidth-pro)
    local model=${1#realwidth-}
    step "real_width_$model" 570 python3 benchmarks/bench_real_width.py --model "$model" --budget-s "${DSV4_RW_BUDGET:-500}" \
        --workdir /tmp/dsv4-rw --out "$RES/real_width_$model.json"
    if [ -n "${OUT:-}" ]; then cp "$RES/real_width_$model.json" "$OUT/" 2>/dev/null; fi ;;
  decode)    # issue #43's decode target: graph step wall against the device's own work, tiny and medium
    step bench_decode_graphs 300 python3 benchmarks/bench_decode_graphs.py --configs tiny,medium --steps 32 \
        --device cuda --backend cutedsl_sm90 --json "$RES/bench_decode_graphs.json"
    if [ -n "${OUT:-}" ]; then cp "$RES/bench_decode_graphs.json" "$OUT/" 2>/dev/null; fi ;;
  realwidth-8k)   # issue #43's 8k prefill with the full harness, alone in one call (3 Flash layers: window, CSA, HCA;
    # 190 s on an H100 with cutedsl_sm90 alone, whose harness ratio then had no plain emulated forward to divide by)
    step real_width_flash_8k 590 python3 benchmarks/bench_real_width.py --model flash --layers 3 --prefill 8192 \
        --backends cutedsl_sm90,emulated --decode-cache 32768 --decode-steps 2 --budget-s "${DSV4_RW_BUDGET:-540}" \
        --workdir /tmp/dsv4-rw --out "$RES/real_width_flash_8k.json"
    if [ -n "${OUT:-}" ]; then cp "$RES/real_width_flash_8k.json" "$OUT/" 2>/dev/null; fi ;;
  flatness)   # the streaming reference's peak after 2 against 8 real-width Flash layers (issue #43's flatness
    # target); reference only: the official layout is deleted before the NVFP4 one is written (34 GB at 8 layers)
    step real_width_flash_8layers 420 python3 benchmarks/bench_real_width.py --model flash --layers 8 --prefill 1024 \
        --backends "" --no-harness --decode-cache 4096 --decode-steps 2 --budget-s "${DSV4_RW_BUDGET:-360}" \
        --workdir /tmp/dsv4-rw --out "$RES/real_width_flash_8layers.json"
    if [ -n "${OUT:-}" ]; then cp "$RES/real_width_flash_8layers.json" "$OUT/" 2>/dev/null; fi ;;
  shapes)
    step nvfp4_shapes 590 python3 benchmarks/bench_nvfp4_shapes.py --models "${DSV4_SHAPES_MODELS:-flash,pro}" \
        --budget-s "${DSV4_SHAPES_BUDGET:-470}" --json "$RES/bench_nvfp4_shapes.json"
    if [ -n "${OUT:-}" ]; then cp "$RES/bench_nvfp4_shapes.json" "$OUT/" 2>/dev/null; fi ;;
  prefill)
    step pytest_prefill 180 python3 -m pytest -q -rs -p no:cacheprovider tests/dsv4/kernels/test_sm90_prefill_gemm_gpu.py \
        tests/dsv4/kernels/test_sm90_prefill_route.py --junitxml="$RES/pytest_prefill.xml"
    step nvfp4_shapes_prefill 330 python3 benchmarks/bench_nvfp4_shapes.py --models "${DSV4_SHAPES_MODELS:-flash,pro}" \
        --ms 64,128,256,512,1024,4096 --budget-s "${DSV4_SHAPES_BUDGET:-250}" --json "$RES/bench_nvfp4_shapes_prefill.json"
    if [ -n "${OUT:-}" ]; then cp "$RES/bench_nvfp4_shapes_prefill.json" "$OUT/" 2>/dev/null; fi ;;
  bankload)
    step bench_bank_load 300 python3 benchmarks/bench_bank_load.py --device cuda --workdir /tmp --repeat 2 \
        --json "$RES/bench_bank_load.json"
    if [ -n "${OUT:-}" ]; then cp "$RES/bench_bank_load.json" "$OUT/" 2>/dev/null; fi ;;
  streamed)
    step bench_streamed 300 python3 benchmarks/bench_streamed.py --preset tiny-deep --device cuda --backend cutedsl_sm90 \
        --steps 32 --repeat 3 --json "$RES/bench_streamed.json"
    if [ -n "${OUT:-}" ]; then cp "$RES/bench_streamed.json" "$OUT/" 2>/dev/null; fi ;;
  kernel-profile)
    step profile_decode_gemm 120 python3 benchmarks/profile_sm90_decode_gemm.py --json "$RES/profile_decode_gemm.json"
    # ncu reads the hardware counters on Firecracker machines; clocks left alone (--clock-control none)
    step ncu_decode_gemm 180 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section SourceCounters python3 benchmarks/profile_sm90_decode_gemm.py --ncu-region
    step pytest_decode_gemm 200 python3 -m pytest -q -rs -p no:cacheprovider tests/dsv4/kernels/test_sm90_decode_gemm_gpu.py \
        --junitxml="$RES/pytest_decode_gemm.xml"
    if [ -n "${OUT:-}" ]; then cp "$RES/profile_decode_gemm.json" "$OUT/" 2>/dev/null; fi ;;
  *) echo "unknown part $1 (expected tests, parity-zoo, parity-rest, parity, gate, verdicts, dspark, zoo, realwidth-flash, realwidth-pro, realwidth-8k, decode, flatness, shapes, prefill, bankload, streamed, kernel-profile or all)"; return 2 ;;
  esac
}
{
  nvidia-smi -L
  python3 -c "import cutlass, torch; print('cutlass ok, torch', torch.__version__)"
  if [ "$PART" = all ]; then for p in tests parity-zoo parity-rest verdicts dspark zoo; do run_part "$p"; done; else run_part "$PART"; fi
  python3 benchmarks/gpu_validation_summary.py "$RES" --out "$RES/gpu_validation.json"
} 2>&1 | tee -a "$RES/log.txt"
if [ -n "${OUT:-}" ]; then cp "$RES/gpu_validation.json" "$RES/log.txt" "$OUT/" 2>/dev/null; fi
