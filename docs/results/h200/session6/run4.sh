#!/usr/bin/env bash
# Sixth session, fourth device call: the CUDA mHC projection's K slices and finisher rows swept
# at 256-2048 rows (where SGLang's bf16x3 kernel is faster and the hook declines), and the
# inverse-RoPE benchmark at T 6, G 8 again (its exactness check now runs tables_ready, as the
# timed arm). Logs in one archive. Usage: bash .../run4.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 200 python3 benchmark/kernels/bench_hc_mix_stats.py --rows 256,512,1024,2048 --sweep \
  --json "$out/logs/bench_mhc_sweep.json" > "$out/logs/bench_mhc_sweep.log" 2>&1
grep -E "sglang|  ours|sweep|  [0-9.]+ us" "$out/logs/bench_mhc_sweep.log" | cut -c1-150
timeout 40 python3 benchmark/kernels/bench_inverse_rope_quant_fp8.py --tokens 6 --groups 8 \
  --json "$out/logs/bench_irq.json" > "$out/logs/bench_irq.log" 2>&1
grep -E " (ours|sglang)" "$out/logs/bench_irq.log" | cut -c1-110
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
