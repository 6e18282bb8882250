#!/usr/bin/env bash
# The GPU tier in one go: JIT build, `pytest -m gpu`, `dsv41-kernels check` and every benchmark.
# Usage: bash benchmark/run_gpu.sh OUT_DIR   (results: gpu_tests.log, bench.log, *.json)
# SWEEP="row_argmax accept_greedy hc_mix_stats" also times other launch shapes in those
# benchmarks (--sweep).
set -u
out=${1:?usage: run_gpu.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}python PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
status=0
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} | tee "$out/bench.log"
timeout "${GPU_TEST_TIMEOUT:-420}" python3 -m pytest -m gpu -q -rs --durations=10 test/ops ${GPU_TEST_EXTRA:-} \
  > "$out/gpu_tests.log" 2>&1 || status=1
tail -n 3 "$out/gpu_tests.log"
timeout 120 python3 -m dsv41_kernels.cli check >> "$out/bench.log" 2>&1 || status=1
for bench in row_argmax accept_greedy decoding_sched_meta mxfp8_quantize hc_combine_norm moe_fused_gate \
  hc_mix_stats inverse_rope_quant_fp8; do
  echo "== benchmark/kernels/bench_$bench.py" >> "$out/bench.log"
  sweep=()
  if [ -n "${SWEEP:-}" ] && [[ " $SWEEP " == *" $bench "* ]]; then
    sweep=(--sweep)
  fi
  timeout 240 python3 "benchmark/kernels/bench_$bench.py" --json "$out/bench_$bench.json" \
    "${sweep[@]}" >> "$out/bench.log" 2>&1 || status=1
done
if [ -f benchmark/verify_cycle.py ]; then
  echo "== benchmark/verify_cycle.py" >> "$out/bench.log"
  timeout 180 python3 benchmark/verify_cycle.py --json "$out/verify_cycle.json" >> "$out/bench.log" 2>&1 || status=1
fi
cat "$out/bench.log"
exit $status
