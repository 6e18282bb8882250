#!/usr/bin/env bash
# Fourth session, fourth device call: inverse_rope_quant_fp8's CUDA kernel as a dependent launch
# without the cluster attribute (run 3 launched it as clusters of 1). Its GPU tests, benchmark and
# call site. Usage: bash .../run4.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
timeout 50 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --json "$out/bench_irq.json" \
  > "$out/bench_irq.log" 2>&1
grep ours "$out/bench_irq.log" | cut -c1-110
timeout 60 python3 -m benchmark.call_sites --sites wo_a --json "$out/call_sites.json" \
  > "$out/call_sites.log" 2>&1
tail -n 13 "$out/call_sites.log"
timeout 90 python3 -m pytest -m gpu -q -rs -p no:cacheprovider test/ops/attention \
  test/sglang/test_gpu_wo_a.py > "$out/wo_a_tests.log" 2>&1
tail -n 2 "$out/wo_a_tests.log"
