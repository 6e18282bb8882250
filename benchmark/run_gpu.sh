#!/usr/bin/env bash
# The GPU tier and every benchmark, in one go:  bash benchmark/run_gpu.sh OUT [tests|bench|all]
# tests: `pytest -m gpu` over test/ and `dsv41-kernels check` (OUT/gpu_tests.log).
# bench: call_sites, verify_cycle and every bench_<op>.py with --record (their records go to
#   <device>.jsonl in docs/results), then `python -m benchmark.report` (OUT/bench.log); the results
#   files, the plots and docs/performance.md are copied to OUT/results/ too, for a machine whose
#   tree does not come back.
# Where .sglang_env/ is present (tools/sglang_env/README.md) SGLang 0.5.23 is activated first,
# so its call sites and sglang-0.5.23 arms run. SWEEP="row_argmax hc_mix_stats" also times those
# ops' launch shapes (--sweep). In a tree without .git, DSV41_KERNELS_COMMIT names the commit.
set -u
out=$(realpath -m "${1:?usage: run_gpu.sh OUT [tests|bench|all]}")
phase=${2:-all}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
if [ -d .sglang_env ]; then
  # shellcheck source=/dev/null
  source tools/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
else
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}python
fi
status=0
header() {
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  cat "$out/activate.log" 2>/dev/null
}
if [ "$phase" != bench ]; then
  header > "$out/gpu_tests.log"
  python3 -m pytest -m gpu -q -rs -p no:cacheprovider --durations=25 test >> "$out/gpu_tests.log" 2>&1 \
    || status=1
  python3 -m dsv41_kernels.cli check >> "$out/gpu_tests.log" 2>&1 || status=1
  tail -n 40 "$out/gpu_tests.log"
fi
if [ "$phase" != tests ]; then
  header > "$out/bench.log"
  run() { echo "== $*" >> "$out/bench.log"; timeout 300 "$@" >> "$out/bench.log" 2>&1 || status=1; }
  run python3 -m benchmark.call_sites --record
  run python3 -m benchmark.verify_cycle --record
  for op in row_argmax accept_greedy accept_greedy_epilogue sharded_row_argmax decoding_sched_meta \
    mxfp8_quantize hc_combine_norm moe_fused_gate hc_mix_stats hc_boundary hc_post_combine_norm \
    inverse_rope_quant_fp8 rmsnorm_quant_fp8; do
    sweep=()
    [[ " ${SWEEP:-} " == *" $op "* ]] && sweep=(--sweep)
    run python3 "benchmark/kernels/bench_$op.py" --record "${sweep[@]}"
  done
  # the small-row kernel's two launches over a verify cycle's boundaries (issue 37)
  run python3 benchmark/kernels/bench_hc_boundary.py --rows "" --cycle --record
  # the boundary with its statistics beside sublayer stand-ins, against inline (issue 37)
  run python3 benchmark/kernels/bench_hc_post_combine_norm.py --rows "" --overlap 8,64 --record
  gpus=$(nvidia-smi --list-gpus | wc -l)  # the sharded argmax with its collective (NCCL)
  for world in 2 4; do
    [ "$gpus" -ge "$world" ] && run python3 benchmark/kernels/bench_sharded_row_argmax.py \
      --world "$world" --record
  done
  run python3 -m benchmark.report
  rm -rf "$out/results"
  cp -r docs/results "$out/results" && cp docs/performance.md "$out/results/"
  grep -E "^== |Error|error" "$out/bench.log" | tail -n 40
fi
exit $status
