#!/usr/bin/env bash
# Fourth session, first device call: the wo_a op's fix 3 on the GPU (ops and SGLang's caller),
# then its benchmark with the launch-shape sweep. Usage: bash docs/results/h200/session4/run1.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git log -1 --format='%h %s' 2>/dev/null; } > "$out/env.log" 2>&1
timeout 200 python3 -m pytest -m gpu -q -rs -p no:cacheprovider test/ops/attention \
  test/sglang/test_gpu_wo_a.py > "$out/wo_a_tests.log" 2>&1
tail -n 15 "$out/wo_a_tests.log"
timeout 90 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --json "$out/bench_irq.json" \
  > "$out/bench_irq.log" 2>&1
timeout 200 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --sweep --groups 2,8 \
  --json "$out/bench_irq_sweep.json" > "$out/bench_irq_sweep.log" 2>&1
tail -n 4 "$out/bench_irq_sweep.log"
