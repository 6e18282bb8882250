#!/usr/bin/env bash
# Fifth session, fourth device call: the call sites against SGLang's own functions and the router
# and inverse-RoPE op benchmarks, on the final tree (prebuilt modules carried).
# Usage: bash .../run3b.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
timeout 60 python3 benchmark/kernels/bench_moe_fused_gate.py --json "$out/bench_router.json" \
  > "$out/bench_router.log" 2>&1
timeout 60 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --json "$out/bench_irq.json" \
  > "$out/bench_irq.log" 2>&1
timeout 200 python3 -m benchmark.call_sites --sites router,wo_a,combine,mix_stats \
  --json "$out/call_sites.json" > "$out/call_sites.log" 2>&1
grep -v "StandIn" "$out/call_sites.log" | cut -c1-110
grep -E "ours|sglang" "$out/bench_irq.log" | grep "T 6," | cut -c1-100
grep -v "^ *$" "$out/bench_router.log" | cut -c1-150 | tail -n 26
