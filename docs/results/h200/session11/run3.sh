#!/usr/bin/env bash
# Session 11, call 3: the router kernel with 1, 2 or 4 tokens a CTA, swept against our Triton
# kernel at 1-16384 tokens (out/probe11/tpc_sweep.py); the router op bench (the op with its
# CUDA kernel at every T, provisional) beside SGLang's; the router GPU tests (the CUDA-vs-Triton
# test now cycles the tokens a CTA) and SGLang's router caller; the router call site.
# Usage: bash docs/results/h200/session11/run3.sh OUT (carry .sglang_env, out/probe11 and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 120 python3 out/probe11/tpc_sweep.py "$out/logs/tpc_sweep.json" > "$out/logs/tpc_sweep.log" 2>&1
cut -c1-200 "$out/logs/tpc_sweep.log"
timeout 120 python3 benchmark/kernels/bench_moe_fused_gate.py --tokens 1,6,64,256,512,1024,2048,4096,16384 \
  --json "$out/logs/bench_moe_fused_gate.json" > "$out/logs/bench_moe_fused_gate.log" 2>&1
grep -v StandIn "$out/logs/bench_moe_fused_gate.log" | grep "packed router\|sglang-0.5.23  " | cut -c1-120
timeout 100 python3 -m benchmark.call_sites --sites router --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
timeout 280 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe test/sglang/test_gpu.py \
  -k "moe or router or vision" > "$out/logs/tests.log" 2>&1
tail -n 15 "$out/logs/tests.log" | cut -c1-250
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
