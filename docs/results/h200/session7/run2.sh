#!/usr/bin/env bash
# Seventh session, last device call: the final tree's mHC GPU tests and its check (after r1, the
# CUDA source gained a shared x-copy helper and comment edits; measured.py its mhc entry).
# Usage: bash .../run2.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 100 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc \
  "test/sglang/test_gpu.py::test_mix_stats_of_a_v41_layer" > "$out/logs/mhc_tests.log" 2>&1
tail -n 4 "$out/logs/mhc_tests.log" | cut -c1-200
timeout 60 python3 -m dsv41_kernels.cli check --ops hc_mix_stats > "$out/logs/check.log" 2>&1
grep -E "hc_mix_stats|records|exact" "$out/logs/check.log" | cut -c1-40,200-330
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
