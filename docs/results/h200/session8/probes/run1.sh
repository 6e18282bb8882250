#!/usr/bin/env bash
# Session 8, call 1: read-bandwidth probe of the mHC x patterns; the mix-stats GPU tests.
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv > "$out/logs/smi.log" 2>&1
nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -o /tmp/bw out/probe8/bw.cu > "$out/logs/bw_build.log" 2>&1
timeout 120 /tmp/bw > "$out/logs/bw.log" 2>&1
cat "$out/logs/bw.log"
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 200 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_mix_stats.py \
  "test/sglang/test_gpu.py::test_mix_stats_of_a_v41_layer" > "$out/logs/mhc_tests.log" 2>&1
tail -n 6 "$out/logs/mhc_tests.log" | cut -c1-200
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
