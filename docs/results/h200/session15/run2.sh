#!/usr/bin/env bash
# Session 15, call 2: the row argmax and the accept as dependent launches (wait for the previous
# kernel, let the next start early in a grid of one wave): their GPU tests, SGLang's callers, an
# A/B against main's module in one process (probes/argmax_ab.py; carry out/ab), the kernel
# benchmarks and the accept / row_argmax call sites.
# Usage: bash docs/results/h200/session15/run2.sh OUT (carry .sglang_env,
# python/dsv41_kernels/prebuilt and out/ab)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 240 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider \
  test/ops/speculative/test_row_argmax.py test/ops/speculative/test_accept_greedy.py \
  > "$out/logs/tests_argmax.log" 2>&1
tail -n 4 "$out/logs/tests_argmax.log" | cut -c1-250
timeout 120 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/sglang/test_gpu.py \
  -k "accept or argmax" > "$out/logs/tests_sglang_argmax.log" 2>&1
tail -n 4 "$out/logs/tests_sglang_argmax.log" | cut -c1-250
timeout 120 python3 docs/results/h200/session15/probes/argmax_ab.py "$out/logs/argmax_ab.json" \
  > "$out/logs/argmax_ab.log" 2>&1
cat "$out/logs/argmax_ab.log" | tail -n 12
timeout 120 python3 benchmark/kernels/bench_row_argmax.py --json "$out/logs/bench_argmax.json" \
  > "$out/logs/bench_argmax.log" 2>&1
grep -E "sglang|ours" "$out/logs/bench_argmax.log" | cut -c1-110
timeout 90 python3 benchmark/kernels/bench_accept_greedy.py --json "$out/logs/bench_accept.json" \
  > "$out/logs/bench_accept.log" 2>&1
grep -E "sglang|ours" "$out/logs/bench_accept.log" | cut -c1-110
timeout 150 python3 -m benchmark.call_sites --sites accept,row_argmax \
  --json "$out/logs/call_sites.json" > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-140
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
