#!/usr/bin/env bash
# Session 16, calls 4 and 5: the mHC statistics' new launch shapes (128 rows one CTA an SM from 256 rows,
# 256 rows from 2048, 256 (slice, row) pairs a finisher step): the A/B against the shapes before
# (probes/mhc_ab.py), the mHC GPU tests, SGLang's mHC callers, and the mHC call site.
# Usage: bash docs/results/h200/session16/run2.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
tail -n 2 "$out/logs/activate.log" | cut -c1-300
timeout 200 python3 docs/results/h200/session16/probes/mhc_ab.py "$out/logs/mhc_ab.json" \
  > "$out/logs/mhc_ab.log" 2>&1
cut -c1-150 "$out/logs/mhc_ab.log" | tail -n 20
timeout 200 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_mix_stats.py \
  > "$out/logs/tests_mhc.log" 2>&1
tail -n 4 "$out/logs/tests_mhc.log" | cut -c1-250
timeout 120 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/sglang/test_gpu.py \
  -k "mix_stats or mhc" > "$out/logs/tests_sglang_mhc.log" 2>&1
tail -n 4 "$out/logs/tests_sglang_mhc.log" | cut -c1-250
timeout 150 python3 -m benchmark.call_sites --sites mix_stats --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
