#!/usr/bin/env bash
# Seventh session, the final device call of the mHC work: the whole GPU tier (the prebuilt
# modules carried) on the tree with the wgmma projection (32-column partials, 256 rows a CTA from
# 1024 rows, the finisher's new row counts), then the mHC benchmark with SGLang's arm and the
# mix_stats call site. Logs in one archive. Usage: bash .../run1.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1 GPU_TEST_TIMEOUT=400 GPU_TEST_EXTRA="-rfEs"
bash benchmark/run_gpu.sh "$out/logs" tests > "$out/logs/run_gpu.out" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/gpu_tests.log" | cut -c1-300
tail -n 3 "$out/logs/check.log" | cut -c1-200
source benchmark/sglang_env/activate.sh > /dev/null 2>&1
timeout 100 python3 benchmark/kernels/bench_hc_mix_stats.py --rows 6,128,256,512,1024,2048,4096 \
  --json "$out/logs/bench_mhc.json" > "$out/logs/bench_mhc.log" 2>&1
grep -E "compensated|ours|sglang|derived" "$out/logs/bench_mhc.log" | cut -c1-130
timeout 100 python3 -m benchmark.call_sites --sites mix_stats --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-110
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
