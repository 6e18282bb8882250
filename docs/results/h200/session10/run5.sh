#!/usr/bin/env bash
# Session 10, call 5: the final tree's CUDA-router-against-Triton test (rewritten after call 4 to
# check both kernels through run_both) and the argmax benchmark's sweep of both CUDA kernels.
# Usage: bash docs/results/h200/session10/run5.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 120 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe \
  -k "cuda_kernel" > "$out/logs/tests.log" 2>&1
tail -n 3 "$out/logs/tests.log" | cut -c1-250
timeout 60 python3 benchmark/kernels/bench_row_argmax.py --rows 6 --sweep \
  --json "$out/logs/bench_argmax_sweep.json" > "$out/logs/bench_argmax_sweep.log" 2>&1
grep -E "cuda|ours" "$out/logs/bench_argmax_sweep.log" | cut -c1-110
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
