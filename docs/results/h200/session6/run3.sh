#!/usr/bin/env bash
# Sixth session, third device call: the router's unforced SGLang-caller test, rewritten after
# run2 (its weights were 3 ulp from SGLang's fast-math kernel at 1024 tokens: now both are
# measured against the torch reference), with the other router tests; the wheel without nvcc
# (its GPU tier and check); the wo_a call site again (run1 had T 384 at TP 1 at 1.02).
# Logs in one archive. Usage: bash .../run3.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
(
  source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
  timeout 120 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/sglang/test_gpu.py \
    -k "router" > "$out/logs/router_tests.log" 2>&1
  tail -n 4 "$out/logs/router_tests.log" | cut -c1-200
  timeout 120 python3 -m benchmark.call_sites --sites wo_a --json "$out/logs/call_sites.json" \
    > "$out/logs/call_sites.log" 2>&1
  grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-110
)
STEPS=tier timeout 300 bash benchmark/prebuilt_h200.sh "$out/logs/pb" > "$out/logs/pb.out" 2>&1
tail -n 8 "$out/logs/pb.out" | cut -c1-200
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
