#!/usr/bin/env bash
# Eighth session, the last device call: the final tree's mHC GPU tests (the op's and SGLang's
# caller), check of the mHC op, the mHC benchmark with SGLang's arm and the mix_stats call site.
# Logs in one archive. Usage: bash docs/results/h200/session8/run_final.sh OUT
# (carry .sglang_env and python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 200 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_mix_stats.py \
  test/sglang/test_gpu.py -k "mix_stats or mhc" > "$out/logs/mhc_tests.log" 2>&1
tail -n 4 "$out/logs/mhc_tests.log" | cut -c1-200
timeout 60 python3 -m dsv41_kernels.cli check --ops hc_mix_stats > "$out/logs/check.log" 2>&1
tail -n 3 "$out/logs/check.log" | cut -c1-200
timeout 120 python3 benchmark/kernels/bench_hc_mix_stats.py --rows 6,128,256,512,1024,2048,4096 \
  --json "$out/logs/bench_mhc.json" > "$out/logs/bench_mhc.log" 2>&1
grep -E "compensated|ours|sglang|derived" "$out/logs/bench_mhc.log" | cut -c1-130
timeout 120 python3 -m benchmark.call_sites --sites mix_stats --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-110
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
