#!/usr/bin/env bash
# Session 15, call 1: the combine's one CTA a row at 64-192 rows (same bits as the cluster of 4):
# its GPU tests, SGLang's combine caller, the kernel benchmark with the launch-shape sweep, and
# the combine call site (SGLang's `_combine` against ours, one process).
# Usage: bash docs/results/h200/session15/run1.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
tail -n 2 "$out/logs/activate.log" | cut -c1-300
timeout 200 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_combine_norm.py \
  > "$out/logs/tests_combine.log" 2>&1
tail -n 4 "$out/logs/tests_combine.log" | cut -c1-250
timeout 120 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/sglang/test_gpu.py \
  -k "combine" > "$out/logs/tests_sglang_combine.log" 2>&1
tail -n 4 "$out/logs/tests_sglang_combine.log" | cut -c1-250
timeout 200 python3 benchmark/kernels/bench_hc_combine_norm.py --sweep \
  --json "$out/logs/bench_combine.json" > "$out/logs/bench_combine.log" 2>&1
grep -E "hc_combine_norm |cuda 1 CTAs x 640|cuda 4 CTAs x 160|sglang" "$out/logs/bench_combine.log" | cut -c1-140 | head -60
timeout 150 python3 -m benchmark.call_sites --sites combine --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-140
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
