#!/usr/bin/env bash
# Session 10, call 4: the router's CUDA kernel to 256 tokens and its hook's measured table (on up
# to 1024 tokens on SM90), the argmax test's vocabularies fixed (call 3's three failures: 4101
# columns admit at most 64 rows). The GPU tests (the router's 240-case reference test ran in
# call 3), SGLang's router and argmax callers, the router call site.
# Usage: bash docs/results/h200/session10/run4.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 220 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe \
  test/ops/speculative/test_row_argmax.py test/sglang/test_gpu.py \
  -k "(moe or router or vision or argmax or cuda or row) and not random_cases" \
  > "$out/logs/tests.log" 2>&1
tail -n 12 "$out/logs/tests.log" | cut -c1-250
timeout 100 python3 -m benchmark.call_sites --sites router --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
