#!/usr/bin/env bash
# Session 11, call 4: the final router kernel (one token a CTA, rank loads first, branch-free
# slots; the op's CUDA kernel to 320 tokens): our Triton router with 1/2/4 warps a token
# (out/probe11/triton_warps.py), the router op bench and call site, the router GPU tests (the
# 240-case reference test and the CUDA-vs-Triton test included) and SGLang's router caller.
# Usage: bash docs/results/h200/session11/run4.sh OUT (carry .sglang_env, out/probe11 and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 90 python3 out/probe11/triton_warps.py "$out/logs/triton_warps.json" > "$out/logs/triton_warps.log" 2>&1
cut -c1-200 "$out/logs/triton_warps.log"
timeout 90 python3 -m benchmark.call_sites --sites router --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
timeout 100 python3 benchmark/kernels/bench_moe_fused_gate.py --tokens 1,6,16,64,256,320,384,512,1024,2048 \
  --json "$out/logs/bench_moe_fused_gate.json" > "$out/logs/bench_moe_fused_gate.log" 2>&1
grep -v StandIn "$out/logs/bench_moe_fused_gate.log" | grep "packed router\|sglang-0.5.23  \|target" | cut -c1-120
timeout 300 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe test/sglang/test_gpu.py \
  -k "moe or router or vision" > "$out/logs/tests.log" 2>&1
tail -n 8 "$out/logs/tests.log" | cut -c1-250
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
