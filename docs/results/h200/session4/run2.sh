#!/usr/bin/env bash
# Fourth session, second device call: the CUDA kernel of inverse_rope_quant_fp8 (ops tier and
# SGLang's caller), its benchmark and sweep, then the prebuilt wheel's GPU tier and first calls
# (benchmark/prebuilt_h200.sh, steps tier and first). Usage: bash .../run2.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
timeout 150 python3 -m pytest -m gpu -q -rs -p no:cacheprovider test/ops/attention \
  test/sglang/test_gpu_wo_a.py > "$out/wo_a_tests.log" 2>&1
tail -n 6 "$out/wo_a_tests.log"
timeout 60 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --json "$out/bench_irq.json" \
  > "$out/bench_irq.log" 2>&1
timeout 120 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --sweep --groups 2,8 \
  --json "$out/bench_irq_sweep.json" > "$out/bench_irq_sweep.log" 2>&1
STEPS="tier first" PROCESSES=4 timeout 300 bash benchmark/prebuilt_h200.sh "$out/pb" > "$out/pb.out" 2>&1
tail -n 3 "$out/pb.out"
