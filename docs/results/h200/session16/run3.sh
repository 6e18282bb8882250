#!/usr/bin/env bash
# Session 16, call 6: the mHC finisher splitting its mix columns out of its tile (no global
# round trip): the A/B against the finisher before (probes/finish_ab.py, carry out/ab), the mHC
# GPU tests, and the mHC call site.
# Usage: bash docs/results/h200/session16/run3.sh OUT (carry .sglang_env,
# python/dsv41_kernels/prebuilt and out/ab)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
tail -n 1 "$out/logs/activate.log" | cut -c1-120
timeout 100 python3 docs/results/h200/session16/probes/finish_ab.py "$out/logs/finish_ab.json" \
  > "$out/logs/finish_ab.log" 2>&1
cut -c1-150 "$out/logs/finish_ab.log" | tail -n 14
timeout 80 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_mix_stats.py \
  > "$out/logs/tests_mhc.log" 2>&1
tail -n 3 "$out/logs/tests_mhc.log" | cut -c1-250
timeout 100 python3 -m benchmark.call_sites --sites mix_stats --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn\|tilelang" "$out/logs/call_sites.log" | cut -c1-120
