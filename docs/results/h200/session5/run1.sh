#!/usr/bin/env bash
# Fifth session, first device call: programmatic dependent launches with an early trigger
# (router, mHC projection and finisher, combine, wo_a) and the router's int32 selection.
# The touched ops' GPU tests, then the call sites and op benchmarks against SGLang's own.
# Usage: bash docs/results/h200/session5/run1.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
tail -n 1 "$out/activate.log"
timeout 200 python3 -m pytest -m gpu -q -rs -p no:cacheprovider test/ops/moe test/ops/mhc \
  test/ops/attention > "$out/ops_tests.log" 2>&1
tail -n 3 "$out/ops_tests.log"
timeout 60 python3 benchmark/kernels/bench_moe_fused_gate.py --json "$out/bench_router.json" \
  > "$out/bench_router.log" 2>&1
timeout 50 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --json "$out/bench_irq.json" \
  > "$out/bench_irq.log" 2>&1
timeout 220 python3 -m benchmark.call_sites --sites router,wo_a,combine,mix_stats \
  --json "$out/call_sites.json" > "$out/call_sites.log" 2>&1
cut -c1-160 "$out/call_sites.log"
grep -v "^ *$" "$out/bench_router.log" | cut -c1-140 | tail -n 20
