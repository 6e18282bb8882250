#!/usr/bin/env bash
# Session 13, call 1: the accept on the argmax's CUDA kernels past 8 rows (clusters, one CTA a
# row from 96 rows, 4 vectors a thread in flight while one CTA an SM holds the rows): the
# speculative GPU tests and SGLang's verify callers, the argmax's launch-shape sweep, the
# accept and argmax benches with SGLang's arm, and both call sites; then the router probe
# (probes/router_pdl_probe.py: the warp layout with and without its early start, 1024-16384
# tokens).
# Usage: bash docs/results/h200/session13/run1.sh OUT (carry .sglang_env,
# python/dsv41_kernels/prebuilt and out/probe13, which make_notrigger.sh fills)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 180 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/speculative \
  test/sglang/test_gpu.py -k "not sharded and not router and not vision and not combine and not mix" \
  > "$out/logs/tests.log" 2>&1
tail -n 6 "$out/logs/tests.log" | cut -c1-250
timeout 60 python3 benchmark/kernels/bench_accept_greedy.py --bs 1,4,16,32,44,64 \
  --json "$out/logs/bench_accept.json" > "$out/logs/bench_accept.log" 2>&1
grep -v StandIn "$out/logs/bench_accept.log" | grep "sglang-0.5.23\|ours" | cut -c1-120
timeout 100 python3 benchmark/kernels/bench_row_argmax.py --rows 1,6,64,96,128,192,256,384 --sweep \
  --json "$out/logs/bench_argmax.json" > "$out/logs/bench_argmax.log" 2>&1
grep -v StandIn "$out/logs/bench_argmax.log" | grep "sglang-0.5.23\|ours\|rows 1024\|rows 512x8" | cut -c1-120
timeout 90 python3 -m benchmark.call_sites --sites accept,row_argmax \
  --json "$out/logs/call_sites.json" > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120 | tail -n 30
timeout 120 python3 docs/results/h200/session13/probes/router_pdl_probe.py \
  "$out/logs/router_pdl_probe.json" out/probe13/gate_notrigger.so > "$out/logs/router_pdl_probe.log" 2>&1
grep -v StandIn "$out/logs/router_pdl_probe.log" | cut -c1-400
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
