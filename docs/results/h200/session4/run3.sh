#!/usr/bin/env bash
# Fourth session, third device call: the dependent launch (PDL) of the inverse_rope_quant_fp8
# and hc_combine_norm CUDA kernels. The prebuilt wheel's GPU tier and check (every op, no nvcc),
# SGLang's attention-output caller, then both call sites against SGLang's own functions and the
# op benchmark. Usage: bash .../run3.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
STEPS=tier timeout 270 bash benchmark/prebuilt_h200.sh "$out/pb" > "$out/pb.out" 2>&1
tail -n 4 "$out/pb.out"
source benchmark/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
timeout 80 python3 -m pytest -m gpu -q -rs -p no:cacheprovider test/sglang/test_gpu_wo_a.py \
  > "$out/wo_a_tests.log" 2>&1
tail -n 2 "$out/wo_a_tests.log"
timeout 50 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --json "$out/bench_irq.json" \
  > "$out/bench_irq.log" 2>&1
timeout 150 python3 -m benchmark.call_sites --sites wo_a,combine --json "$out/call_sites.json" \
  > "$out/call_sites.log" 2>&1
cat "$out/call_sites.log" | cut -c1-150
