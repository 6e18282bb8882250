#!/usr/bin/env bash
# Session 12, call 7: the router's warp layout (a warp a token) from 2048 to 16384 tokens beside
# our Triton kernel and SGLang's arm (the op bench), with CUDA_MAX_TOKENS raised to 16384 in the
# working tree for this call only (commit 897f7bc otherwise).
# Usage: bash docs/results/h200/session12/run7.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 150 python3 benchmark/kernels/bench_moe_fused_gate.py \
  --tokens 2048,2560,3072,4096,6144,8192,16384 \
  --json "$out/logs/bench_moe_fused_gate.json" > "$out/logs/bench_moe_fused_gate.log" 2>&1
grep -v StandIn "$out/logs/bench_moe_fused_gate.log" | grep "packed router\|sglang-0.5.23  " | cut -c1-120
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
