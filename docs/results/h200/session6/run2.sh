#!/usr/bin/env bash
# Sixth session, second device call: the whole GPU tier again with failures listed (run1's had
# one failure whose name its tail did not show), on the tree where the mHC projection reads fn
# itself as hi and keeps only the residual lo; then the mHC benchmark (with the bytes kept per
# fn), the mix_stats call site, and the inverse-RoPE benchmark at T 6 / 384 with the table read
# before and after the wait. Every log goes into one archive (eight files come back at most).
# Usage: bash .../run2.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1 GPU_TEST_TIMEOUT=400 GPU_TEST_EXTRA="-rfEs"
bash benchmark/run_gpu.sh "$out/logs" tests > "$out/logs/run_gpu.out" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/gpu_tests.log" | cut -c1-300
tail -n 3 "$out/logs/check.log" | cut -c1-200
source benchmark/sglang_env/activate.sh > /dev/null 2>&1
timeout 90 python3 benchmark/kernels/bench_hc_mix_stats.py --rows 6,128,256,1024,4096 \
  --json "$out/logs/bench_mhc.json" > "$out/logs/bench_mhc.log" 2>&1
grep -E "compensated|small_row|ours|sglang|derived|target" "$out/logs/bench_mhc.log" | cut -c1-120
timeout 60 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --tokens 6,384 \
  --groups 2,8 --json "$out/logs/bench_irq.json" > "$out/logs/bench_irq.log" 2>&1
grep -E " (ours|sglang)" "$out/logs/bench_irq.log" | cut -c1-110
timeout 90 python3 -m benchmark.call_sites --sites mix_stats --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-110
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
