#!/usr/bin/env bash
# Session 11, call 6: every call site in one run (commit a497e84: the router as in call 4, the
# other ops as in session 10), SGLang 0.5.23's function against ours in one process.
# Usage: bash docs/results/h200/session11/run6.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 320 python3 -m benchmark.call_sites --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
