#!/usr/bin/env bash
# Session 11, call 5: the router's CUDA kernel with 1, 2 or 4 experts a thread (CTAs of 384,
# 192 or 96 threads at E 384), swept against our Triton
# kernel at 1-16384 tokens (out/probe11/per_sweep.py); the op bench and the router call site
# with the provisional rule (1 a thread to 320 tokens, 4 beyond, the CUDA kernel at every T);
# the router's bitwise GPU tests (CUDA against Triton cycling 1/2/4 a thread; the 240-case test).
# Usage: bash docs/results/h200/session11/run5.sh OUT (carry .sglang_env, out/probe11 and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 120 python3 out/probe11/per_sweep.py "$out/logs/per_sweep.json" > "$out/logs/per_sweep.log" 2>&1
cut -c1-200 "$out/logs/per_sweep.log"
timeout 90 python3 -m benchmark.call_sites --sites router --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
timeout 100 python3 benchmark/kernels/bench_moe_fused_gate.py --tokens 1,6,64,256,512,1024,2048,4096,16384 \
  --json "$out/logs/bench_moe_fused_gate.json" > "$out/logs/bench_moe_fused_gate.log" 2>&1
grep -v StandIn "$out/logs/bench_moe_fused_gate.log" | grep "packed router\|sglang-0.5.23  " | cut -c1-120
timeout 200 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe \
  -k "random_cases or equals_triton or graph_replay or subnormal" > "$out/logs/tests.log" 2>&1
tail -n 5 "$out/logs/tests.log" | cut -c1-250
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
