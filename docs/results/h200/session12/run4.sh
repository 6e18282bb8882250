#!/usr/bin/env bash
# Session 12, call 4: the router as committed (a CTA a token to 132 tokens, 4 warps a token to
# 660, a warp a token to 2048, the straight-line score): its GPU tests and SGLang's router
# caller, the router call site (1-4096 tokens) and the op bench with SGLang's arm.
# Usage: bash docs/results/h200/session12/run4.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 120 python3 -m benchmark.call_sites --sites router --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120 | tail -n 12
timeout 100 python3 benchmark/kernels/bench_moe_fused_gate.py \
  --tokens 1,6,64,256,320,512,1024,1536,2048,3072,4096,16384 \
  --json "$out/logs/bench_moe_fused_gate.json" > "$out/logs/bench_moe_fused_gate.log" 2>&1
grep -v StandIn "$out/logs/bench_moe_fused_gate.log" | grep "packed router\|sglang-0.5.23  " | cut -c1-120
timeout 280 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe \
  test/sglang/test_gpu.py -k "moe or router or vision" > "$out/logs/tests.log" 2>&1
tail -n 6 "$out/logs/tests.log" | cut -c1-250
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
