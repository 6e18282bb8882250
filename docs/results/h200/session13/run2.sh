#!/usr/bin/env bash
# Session 13, call 2: the router's slot loop that moves a winner to its second best by selects,
# and its early start only where two grids fit: the router's GPU tests and SGLang's router
# caller; probes/router_probe2.py (new against old kernel to 2048 tokens, the warp layout to
# 65536 beside our Triton kernel and SGLang's); probes/accept_probe.py (two placements of the
# accept's request read, and the one-CTA-a-row accept in two waves).
# Usage: bash docs/results/h200/session13/run2.sh OUT (carry .sglang_env,
# python/dsv41_kernels/prebuilt and out/probe13: make_old_router.sh 41b36c1 out/probe13 and
# make_accept_variants.sh out/probe13)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 130 python3 docs/results/h200/session13/probes/router_probe2.py \
  "$out/logs/router_probe2.json" out/probe13/gate_old.so > "$out/logs/router_probe2.log" 2>&1
grep -v StandIn "$out/logs/router_probe2.log" | cut -c1-600
timeout 60 python3 docs/results/h200/session13/probes/accept_probe.py \
  "$out/logs/accept_probe.json" out/probe13 > "$out/logs/accept_probe.log" 2>&1
grep -v StandIn "$out/logs/accept_probe.log" | cut -c1-300
timeout 240 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe \
  test/sglang/test_gpu.py -k "moe or router or vision" > "$out/logs/tests.log" 2>&1
tail -n 6 "$out/logs/tests.log" | cut -c1-250
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
