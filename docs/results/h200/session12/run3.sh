#!/usr/bin/env bash
# Session 12, call 3: the router's list layouts (K warps a token) beside the CTA and warp layouts
# and our Triton kernel (out/probe12/list_sweep.py, this commit's moe_fused_gate module for sm_90a
# copied to out/probe12/moe_list_layouts.so: the prebuilt folder and .sglang_env together
# exceeded the carry).
# Usage: bash docs/results/h200/session12/run3.sh OUT (carry .sglang_env and out/probe12)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 200 python3 out/probe12/list_sweep.py "$out/logs/list_sweep.json" out/probe12/moe_list_layouts.so \
  > "$out/logs/list_sweep.log" 2>&1
cut -c1-300 "$out/logs/list_sweep.log"
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
