#!/usr/bin/env bash
# Session 9, call 3: the fused wgmma kernel. A smoke run (a hang burns only 60 s), the mHC GPU
# tests (the op's and SGLang's caller), check of the mHC op, the fused probe, the mHC
# benchmark with SGLang's arm and the mix_stats call site.
# Usage: bash docs/results/h200/session9/run2.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 60 python3 -c "
import torch
from dsv41_kernels.cases.hc_mix_stats import example_inputs
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats
for m in (1024, 4096, 300):
    x, fn, scale, base = example_inputs(m, 5120, device='cuda', seed=1)
    print(m, hc_mix_stats(x, fn, scale, base)[2][0, 0].tolist(), flush=True)
torch.cuda.synchronize(); print('smoke ok')" > "$out/logs/smoke.log" 2>&1
tail -n 2 "$out/logs/smoke.log"
grep -q "smoke ok" "$out/logs/smoke.log" || { tar -C "$out" -czf "$out/logs.tgz" logs; exit 1; }
timeout 200 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_mix_stats.py \
  test/sglang/test_gpu.py -k "mix_stats or mhc or cuda_projection or fused" > "$out/logs/mhc_tests.log" 2>&1
tail -n 6 "$out/logs/mhc_tests.log" | cut -c1-250
timeout 60 python3 -m dsv41_kernels.cli check --ops hc_mix_stats > "$out/logs/check.log" 2>&1
tail -n 4 "$out/logs/check.log" | cut -c1-40,60-130
timeout 150 python3 docs/results/h200/session9/probes/fused_probe.py "$out/logs/fused_probe.json" \
  > "$out/logs/fused_probe.log" 2>&1
cut -c1-600 "$out/logs/fused_probe.log"
timeout 120 python3 benchmark/kernels/bench_hc_mix_stats.py --rows 6,128,256,512,1024,2048,4096 \
  --json "$out/logs/bench_mhc.json" > "$out/logs/bench_mhc.log" 2>&1
grep -E "compensated|ours|sglang|derived" "$out/logs/bench_mhc.log" | cut -c1-130
timeout 150 python3 -m benchmark.call_sites --sites mix_stats --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-110
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
