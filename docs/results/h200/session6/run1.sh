#!/usr/bin/env bash
# Sixth session, first device call (prebuilt modules carried, so the tier builds little): the
# whole GPU tier and check on the tree with the inverse-RoPE kernel reading the position and the
# table before its dependency wait (tables_ready, what the wo_a hook passes), the combine's
# 96-row cap, the cached one-wave answer and the router's unforced SGLang-caller test; then the
# inverse-RoPE benchmark (T 6 / 24 with the launch-shape sweep at G 8) and the call sites of the
# hooks that changed. Usage: bash .../run1.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 GPU_TEST_TIMEOUT=380
bash benchmark/run_gpu.sh "$out" tests > "$out/run_gpu.out" 2>&1
tail -n 30 "$out/run_gpu.out" | cut -c1-200
source benchmark/sglang_env/activate.sh > /dev/null 2>&1
timeout 60 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --tokens 6,24 \
  --json "$out/bench_irq.json" > "$out/bench_irq.log" 2>&1
grep -E " (ours|sglang) " "$out/bench_irq.log" | cut -c1-100
timeout 50 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --sweep --tokens 6 \
  --groups 8 --json "$out/bench_irq_sweep.json" > "$out/bench_irq_sweep.log" 2>&1
grep -E " (ours|sglang|cuda [0-9])" "$out/bench_irq_sweep.log" | cut -c1-100
timeout 100 python3 -m benchmark.call_sites --sites wo_a,combine,router \
  --json "$out/call_sites.json" > "$out/call_sites.log" 2>&1
grep -v "StandIn" "$out/call_sites.log" | cut -c1-110
