#!/usr/bin/env bash
# Session 10, call 1: probes. A smoke run (60 s), the one-CTA-a-row argmax kernel's shapes against
# the cluster kernel and SGLang's argmax (out/probe10/argmax_probe.py), the router's time taken
# apart (out/probe10/router_probe.py).
# Usage: bash docs/results/h200/session10/run1.sh OUT (carry .sglang_env, out/probe10 and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 60 python3 -c "
import torch
from dsv41_kernels.ops.speculative.argmax_reduction import cuda_module
x = torch.randn(130, 129280, device='cuda'); o = torch.empty(130, dtype=torch.int64, device='cuda')
cuda_module(x.device).row_argmax_rows_shape(x, o, 512, 4)
print(bool((o == x.argmax(-1)).all()), 'smoke ok')" > "$out/logs/smoke.log" 2>&1
tail -n 2 "$out/logs/smoke.log"
grep -q "smoke ok" "$out/logs/smoke.log" || { tar -C "$out" -czf "$out/logs.tgz" logs; exit 1; }
timeout 150 python3 out/probe10/argmax_probe.py "$out/logs/argmax_probe.json" > "$out/logs/argmax_probe.log" 2>&1
cat "$out/logs/argmax_probe.log" | cut -c1-200
timeout 120 python3 out/probe10/router_probe.py "$out/logs/router_probe.json" > "$out/logs/router_probe.log" 2>&1
cat "$out/logs/router_probe.log" | cut -c1-200
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
