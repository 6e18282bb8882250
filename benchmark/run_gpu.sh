#!/usr/bin/env bash
# The GPU tier: `pytest -m gpu` (ours and SGLang's call sites), `dsv41-kernels check`, every
# benchmark. Usage: bash benchmark/run_gpu.sh OUT_DIR [tests|bench|all]   (default all)
# Results in OUT_DIR: gpu_tests.log, check.log, bench.log, call_sites.log, verify_cycle.log and
# the JSON files. Where .sglang_env/ is present (benchmark/sglang_env/README.md) SGLang 0.5.23 is
# activated first, so its call sites and its sglang-0.5.23 benchmark arms run too.
# SWEEP="row_argmax accept_greedy hc_mix_stats" also times other launch shapes (--sweep).
set -u
out=${1:?usage: run_gpu.sh OUT_DIR [tests|bench|all]}
phase=${2:-all}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
if [ -d .sglang_env ]; then
  # shellcheck source=/dev/null
  source benchmark/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
  cat "$out/activate.log"
else
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}python
fi
status=0
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} | tee "$out/bench.log"
if [ "$phase" != bench ]; then
  timeout "${GPU_TEST_TIMEOUT:-420}" python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
    --durations=15 test/ops test/sglang ${GPU_TEST_EXTRA:-} > "$out/gpu_tests.log" 2>&1 || status=1
  tail -n 25 "$out/gpu_tests.log"
  timeout 120 python3 -m dsv41_kernels.cli check > "$out/check.log" 2>&1 || status=1
  tail -n 3 "$out/check.log"
fi
if [ "$phase" != tests ]; then
  for module in call_sites verify_cycle; do
    timeout 240 python3 -m "benchmark.$module" --json "$out/$module.json" > "$out/$module.log" 2>&1 \
      || status=1
    cat "$out/$module.log"
  done
  for bench in row_argmax accept_greedy sharded_row_argmax decoding_sched_meta mxfp8_quantize \
    hc_combine_norm moe_fused_gate hc_mix_stats inverse_rope_quant_fp8; do
    echo "== benchmark/kernels/bench_$bench.py" >> "$out/bench.log"
    sweep=()
    if [ -n "${SWEEP:-}" ] && [[ " $SWEEP " == *" $bench "* ]]; then
      sweep=(--sweep)
    fi
    timeout 240 python3 "benchmark/kernels/bench_$bench.py" --json "$out/bench_$bench.json" \
      "${sweep[@]}" >> "$out/bench.log" 2>&1 || status=1
  done
  # With several GPUs, the sharded argmax with its collective too (NCCL, TP 2 and 4).
  gpus=$(nvidia-smi --list-gpus | wc -l)
  for world in 2 4; do
    if [ "$gpus" -ge "$world" ]; then
      echo "== benchmark/kernels/bench_sharded_row_argmax.py --world $world" >> "$out/bench.log"
      timeout 240 python3 benchmark/kernels/bench_sharded_row_argmax.py --world "$world" \
        --json "$out/bench_sharded_row_argmax_tp$world.json" >> "$out/bench.log" 2>&1 || status=1
    fi
  done
fi
exit $status
