#!/usr/bin/env bash
# Session 10, call 3: the router's CUDA kernel as ranked lists (to 512 tokens) and the argmax's
# one-CTA-a-row kernel (from 96 rows). A smoke run (60 s), the router's and the argmax's GPU
# tests and SGLang's callers, the router and argmax benchmarks, their call sites.
# Usage: bash docs/results/h200/session10/run3.sh OUT (carry .sglang_env and
# python/dsv41_kernels/prebuilt)
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 60 python3 -c "
import torch
from dsv41_kernels.ops.moe.moe_fused_gate import moe_fused_gate, moe_fused_gate_admission
from dsv41_kernels.ops.speculative.row_argmax import row_argmax
x = torch.randn(6, 384, device='cuda'); b = torch.zeros(384, device='cuda')
print(moe_fused_gate_admission(x, b, top_k=6))
print(moe_fused_gate(x, b, top_k=6)[1].tolist())
y = torch.randn(128, 129280, device='cuda'); print(bool((row_argmax(y) == y.argmax(-1)).all()))
torch.cuda.synchronize(); print('smoke ok')" > "$out/logs/smoke.log" 2>&1
tail -n 4 "$out/logs/smoke.log" | cut -c1-300
grep -q "smoke ok" "$out/logs/smoke.log" || { tar -C "$out" -czf "$out/logs.tgz" logs; exit 1; }
timeout 280 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/moe \
  test/ops/speculative/test_row_argmax.py test/ops/speculative/test_accept_greedy.py \
  test/sglang/test_gpu.py -k "moe or router or vision or argmax or accept or cuda" \
  > "$out/logs/tests.log" 2>&1
tail -n 8 "$out/logs/tests.log" | cut -c1-250
timeout 90 python3 benchmark/kernels/bench_moe_fused_gate.py --tokens 1,6,16,64,256,512,768,1024,2048 \
  --json "$out/logs/bench_router.json" > "$out/logs/bench_router.log" 2>&1
grep -E "packed router|sglang-0.5.23 " "$out/logs/bench_router.log" | cut -c1-110
timeout 90 python3 benchmark/kernels/bench_row_argmax.py --json "$out/logs/bench_argmax.json" \
  > "$out/logs/bench_argmax.log" 2>&1
grep -E "ours|sglang" "$out/logs/bench_argmax.log" | cut -c1-110
timeout 150 python3 -m benchmark.call_sites --sites router,row_argmax --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-120
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
