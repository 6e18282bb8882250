#!/usr/bin/env bash
# Session 11, call 2: the router kernel with every rank load first and a branch-free slot loop
# (its phases beside session 10's: out/probe11/router_probe.py modes 0 and 5), session 10's
# module against the new one at 1-2048 tokens, bitwise (out/probe11/gate_compare.py), the router
# op bench and call site.
# Usage: bash docs/results/h200/session11/run2.sh OUT (carry .sglang_env, out/probe11 and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 80 python3 out/probe11/router_probe.py "$out/logs/router_probe.json" > "$out/logs/router_probe.log" 2>&1
cut -c1-200 "$out/logs/router_probe.log"
timeout 100 python3 out/probe11/gate_compare.py "$out/logs/gate_compare.json" > "$out/logs/gate_compare.log" 2>&1
cut -c1-200 "$out/logs/gate_compare.log"
timeout 100 python3 benchmark/kernels/bench_moe_fused_gate.py --tokens 1,6,16,64,256,512,768,1024,2048 \
  --json "$out/logs/bench_moe_fused_gate.json" > "$out/logs/bench_moe_fused_gate.log" 2>&1
grep -v StandIn "$out/logs/bench_moe_fused_gate.log" | cut -c1-160 | tail -40
timeout 100 python3 -m benchmark.call_sites --sites router --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
