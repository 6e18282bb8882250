#!/usr/bin/env bash
# Session 9, call 1: the CUDA finisher. A smoke run (a hang burns only 60 s), the mHC GPU
# tests (the op's and SGLang's caller), check of the mHC op, the finisher probe.
# Usage: bash docs/results/h200/session9/run1.sh OUT (carry .sglang_env and
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
for m in (128, 1024, 4096):
    x, fn, scale, base = example_inputs(m, 5120, device='cuda', seed=1)
    print(m, hc_mix_stats(x, fn, scale, base)[2][0, 0].tolist(), flush=True)
torch.cuda.synchronize(); print('smoke ok')" > "$out/logs/smoke.log" 2>&1
tail -n 2 "$out/logs/smoke.log"
grep -q "smoke ok" "$out/logs/smoke.log" || { tar -C "$out" -czf "$out/logs.tgz" logs; exit 1; }
timeout 200 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_mix_stats.py \
  test/sglang/test_gpu.py -k "mix_stats or mhc or cuda_projection or finisher" > "$out/logs/mhc_tests.log" 2>&1
tail -n 6 "$out/logs/mhc_tests.log" | cut -c1-250
timeout 60 python3 -m dsv41_kernels.cli check --ops hc_mix_stats > "$out/logs/check.log" 2>&1
tail -n 4 "$out/logs/check.log" | cut -c1-40,60-130
timeout 240 python3 docs/results/h200/session9/probes/finish_probe.py "$out/logs/finish_probe.json" \
  > "$out/logs/finish_probe.log" 2>&1
cut -c1-400 "$out/logs/finish_probe.log"
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
