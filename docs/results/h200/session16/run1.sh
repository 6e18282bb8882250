#!/usr/bin/env bash
# Session 16, call 2: every call site in one run at main's final kernels (SGLang 0.5.23's function
# against ours in one process, tilelang staged by call 1 so SGLang's 2-31-row mHC path runs),
# then the read floors under issue 15's unmet shapes (probes/read_ceiling.py) and the mHC
# statistics over launch shapes the defaults do not take (probes/mhc_shapes.py).
# Usage: bash docs/results/h200/session16/run1.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt; within 30 s of `bash benchmark/sglang_env/stage_tl.sh`)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
tail -n 2 "$out/logs/activate.log" | cut -c1-300
probes=docs/results/h200/session16/probes
timeout 100 python3 $probes/read_ceiling.py "$out/logs/read_ceiling.json" \
  > "$out/logs/read_ceiling.log" 2>&1
cat "$out/logs/read_ceiling.log" | cut -c1-120 | tail -n 50
timeout 120 python3 $probes/mhc_shapes.py "$out/logs/mhc_shapes.json" > "$out/logs/mhc_shapes.log" 2>&1
cat "$out/logs/mhc_shapes.log" | cut -c1-120 | tail -n 30
timeout 330 python3 -m benchmark.call_sites --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
