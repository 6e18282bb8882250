#!/usr/bin/env bash
# Session 13, call 3: every call site in one run (commit of this script: the accept on the
# argmax's CUDA kernels, the router's CUDA kernel to 65536 tokens), SGLang 0.5.23's function
# against ours in one process, with tilelang staged (`bash benchmark/sglang_env/stage_tl.sh`,
# carry .sglang_env_tl) so SGLang's mHC path for 2-31 rows runs; then SGLang's router caller
# (the hook's reach, now every token count on SM90).
# Usage: bash docs/results/h200/session13/run3.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt; within 30 s of the staging call, on the same machine)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
tail -n 2 "$out/logs/activate.log" | cut -c1-300
timeout 360 python3 -m benchmark.call_sites --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
timeout 100 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/sglang/test_gpu.py \
  -k "router or vision" > "$out/logs/tests.log" 2>&1
tail -n 4 "$out/logs/tests.log" | cut -c1-250
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
