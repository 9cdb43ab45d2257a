#!/usr/bin/env bash
# One H200 validation session, run from the repo root with CuTe DSL on PYTHONPATH: the bug-budget
# column on the sm_90a kernels (first-token parity on cuda), DSpark draft parity with every target and
# draft call audited on them (docs/dspark.md), CUDA-graph decode vs eager, the decode benchmark and the
# decode-GEMM launch sweep (~10 min in all). Each step has a time limit; logs and
# JSON land in $OUT (one tarball + the log).
# QUICK=1 runs only first-token parity, chat draft parity and the graph test, with tighter limits (for a
# nearly spent device budget).
set -u
RES=/tmp/h200-results
FINAL_OUT=${OUT:-$RES}
QUICK=${QUICK:-0}
mkdir -p "$RES"
export OUT=$RES PYTHONUNBUFFERED=1 DSV4_PARITY_CACHE=/tmp/dsv4-cache PYTHONPATH=${PYTHONPATH:-}:$PWD
step() { local t=$1; shift; echo "=== $* (limit ${t}s)"; SECONDS=0; timeout "$t" "$@"; echo "=== exit $? after ${SECONDS}s"; }
{
  nvidia-smi -L
  python3 -c "import cutlass, torch; print('cutlass ok, torch', torch.__version__)"
  step $((QUICK ? 95 : 110)) python3 -m parity.first_token --mode chat --device cuda \
      --records "$RES/ft_chat.jsonl" --json "$RES/ft_chat.json"
  step $((QUICK ? 200 : 300)) python3 -m parity.dspark --mode chat --device cuda --backend cutedsl_sm90 \
      --json "$RES/dspark_chat.json"
  if [ "$QUICK" = 1 ]; then
    step 70 python3 -m pytest -q -rs -p no:cacheprovider tests/dsv4/test_decode_graphs.py
  else
    step 140 python3 -m pytest -q -rs -p no:cacheprovider tests/dsv4/test_decode_graphs.py \
        tests/dsv4/test_decode_readiness.py tests/parity/test_decode_gpu.py
    step 300 python3 -m parity.dspark --mode thinking --device cuda --backend cutedsl_sm90 \
        --json "$RES/dspark_thinking.json"
    step 240 python3 benchmarks/bench_decode_graphs.py --configs tiny,medium --steps 64
    step 60 python3 benchmarks/sweep_sm90_decode_configs.py
  fi
} 2>&1 | tee "$RES/log.txt"
tar czf "$FINAL_OUT/h200-results.tgz" -C /tmp h200-results
