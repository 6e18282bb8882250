#!/usr/bin/env bash
# Session 8, call 2: the TMA wgmma projection: bits and times against the cp.async one, the mHC
# GPU tests, the mHC benchmark with SGLang's arm, the mix_stats call site.
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 120 python3 out/probe8/tma_probe.py "$out/logs/tma_probe.json" > "$out/logs/tma_probe.log" 2>&1 || { cat "$out/logs/tma_probe.log" | tail -30; tar -C "$out" -czf "$out/logs.tgz" logs; exit 1; }
cat "$out/logs/tma_probe.log" | cut -c1-200
timeout 150 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_mix_stats.py \
  "test/sglang/test_gpu.py::test_mix_stats_of_a_v41_layer" > "$out/logs/mhc_tests.log" 2>&1
tail -n 4 "$out/logs/mhc_tests.log" | cut -c1-200
timeout 100 python3 benchmark/kernels/bench_hc_mix_stats.py --rows 6,128,256,512,1024,2048,4096 \
  --json "$out/logs/bench_mhc.json" > "$out/logs/bench_mhc.log" 2>&1
grep -E "compensated|ours|sglang|derived" "$out/logs/bench_mhc.log" | cut -c1-130
timeout 120 python3 -m benchmark.call_sites --sites mix_stats --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-110
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
