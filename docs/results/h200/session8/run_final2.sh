#!/usr/bin/env bash
# Eighth session, after review: the final tree's mHC GPU tests (the op's and SGLang's caller)
# and check of the mHC op (the host side of the wgmma launch and the admission changed after
# run_final.sh). Usage: bash docs/results/h200/session8/run_final2.sh OUT
# (carry .sglang_env and python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 200 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_mix_stats.py \
  test/sglang/test_gpu.py -k "mix_stats or mhc or cuda_projection" > "$out/logs/mhc_tests.log" 2>&1
tail -n 4 "$out/logs/mhc_tests.log" | cut -c1-200
timeout 60 python3 -m dsv41_kernels.cli check --ops hc_mix_stats > "$out/logs/check.log" 2>&1
tail -n 10 "$out/logs/check.log" | cut -c1-40,60-130
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
