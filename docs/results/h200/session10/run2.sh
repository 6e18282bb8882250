#!/usr/bin/env bash
# Session 10, call 2: the CUDA router. A smoke run (60 s), the router's GPU tests and SGLang's
# router caller, the router benchmark with its CUDA sweep, the router call site, and the argmax
# kernels at 8..96 rows (out/probe10/argmax_probe2.py).
# Usage: bash docs/results/h200/session10/run2.sh OUT (carry .sglang_env, out/probe10 and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 60 python3 -c "
import torch
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, moe_fused_gate_admission
x = torch.randn(6, 384, device='cuda'); b = torch.zeros(384, device='cuda')
print(moe_fused_gate_admission(x, b, top_k=6))
print(moe_fused_gate(x, b, top_k=6)[1].tolist())
torch.cuda.synchronize(); print('smoke ok')" > "$out/logs/smoke.log" 2>&1
tail -n 3 "$out/logs/smoke.log" | cut -c1-300
grep -q "smoke ok" "$out/logs/smoke.log" || { tar -C "$out" -czf "$out/logs.tgz" logs; exit 1; }
timeout 200 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe \
  test/sglang/test_gpu.py -k "moe or router or vision" > "$out/logs/router_tests.log" 2>&1
tail -n 8 "$out/logs/router_tests.log" | cut -c1-250
timeout 120 python3 benchmark/kernels/bench_moe_fused_gate.py --tokens 1,6,16,64,256,1024 --sweep \
  --json "$out/logs/bench_router.json" > "$out/logs/bench_router.log" 2>&1
cut -c1-140 "$out/logs/bench_router.log"
timeout 120 python3 -m benchmark.call_sites --sites router --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
timeout 120 python3 out/probe10/argmax_probe2.py "$out/logs/argmax_probe2.json" > "$out/logs/argmax_probe2.log" 2>&1
cat "$out/logs/argmax_probe2.log" | cut -c1-200
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
