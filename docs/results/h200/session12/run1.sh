#!/usr/bin/env bash
# Session 12, call 1: the router's warp layout (a warp a token) and the straight-line score
# (out/probe12/gate_straight.cu, probes/ here), swept beside the CTA layout and our Triton kernel
# (out/probe12/warp_sweep.py); the router call site with the provisional dispatch (the CTA layout
# to 320 tokens, the warp layout with 4 tokens a CTA to 1024).
# Usage: bash docs/results/h200/session12/run1.sh OUT (carry .sglang_env, out/probe12 and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
so=$(ls out/probe12/build_gate_straight/*.so | head -n 1)
timeout 200 python3 out/probe12/warp_sweep.py "$out/logs/warp_sweep.json" "$so" > "$out/logs/warp_sweep.log" 2>&1
cut -c1-400 "$out/logs/warp_sweep.log"
timeout 100 python3 -m benchmark.call_sites --sites router --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120 | tail -n 30
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
