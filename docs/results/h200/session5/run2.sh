#!/usr/bin/env bash
# Fifth session, second device call: the full GPU tier (test/ops and SGLang's callers) and
# `dsv41-kernels check` on the tree with dependent launches that trigger early only in a grid of
# one wave, the router's int32 selection and the inverse-RoPE kernel's groups a warp; then the
# inverse-RoPE benchmark with its launch-shape sweep. Usage: bash .../run2.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 GPU_TEST_TIMEOUT=400
bash benchmark/run_gpu.sh "$out" tests > "$out/run_gpu.out" 2>&1
tail -n 30 "$out/run_gpu.out" | cut -c1-200
source benchmark/sglang_env/activate.sh > /dev/null 2>&1
timeout 110 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --sweep --groups 2,8 \
  --tokens 6,96,384 --json "$out/bench_irq_sweep.json" > "$out/bench_irq_sweep.log" 2>&1
grep -E " (ours|sglang-0.5.23|cuda [0-9]) " "$out/bench_irq_sweep.log" | grep "G 8" | cut -c1-110
