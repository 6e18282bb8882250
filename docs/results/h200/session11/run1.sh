#!/usr/bin/env bash
# Session 11, call 1: the GPU test written after session 10's last call (the fused accept tail's
# _row_argmax through SGLang's binding) with the router and argmax GPU tests; the CUDA router's
# phases and stripped copies (out/probe11/router_probe.py); the combine kernel with 1-3 rows a
# CTA and the early start forced (out/probe11/combine_probe.py).
# Usage: bash docs/results/h200/session11/run1.sh OUT (carry .sglang_env, out/probe11 and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 100 python3 out/probe11/router_probe.py "$out/logs/router_probe.json" > "$out/logs/router_probe.log" 2>&1
cut -c1-200 "$out/logs/router_probe.log"
timeout 120 python3 out/probe11/combine_probe.py "$out/logs/combine_probe.json" > "$out/logs/combine_probe.log" 2>&1
cut -c1-200 "$out/logs/combine_probe.log"
timeout 240 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe \
  test/ops/speculative/test_row_argmax.py test/sglang/test_gpu.py \
  -k "(moe or router or vision or argmax or cuda or row) and not random_cases" \
  > "$out/logs/tests.log" 2>&1
tail -n 12 "$out/logs/tests.log" | cut -c1-250
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
