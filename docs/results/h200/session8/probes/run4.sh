#!/usr/bin/env bash
# Session 8, call 4: the pipelined TMA wgmma projection: bits and times against the cp.async one, the mHC
# GPU tests, the mHC benchmark with SGLang's arm, the mix_stats call site.
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 40 python3 -c "
import torch; from dsv41_kernels.jit import load_module; m = load_module('hc_mix_stats')
x = torch.randn(300, 20480, device='cuda').to(torch.bfloat16); fn = torch.randn(24, 20480, device='cuda')
for rows in (128, 256):
    p = torch.empty(4, 300, 32, device='cuda'); q = torch.empty(4, 300, device='cuda')
    m.hc_mix_partials_tf32(x, fn, fn, p, q, True, rows); torch.cuda.synchronize(); print('ran', rows, flush=True)
" > "$out/logs/smoke.log" 2>&1 || { cat "$out/logs/smoke.log" | tail; tar -C "$out" -czf "$out/logs.tgz" logs; exit 1; }
cat "$out/logs/smoke.log"
timeout 200 python3 out/probe8/shape_probe.py "$out/logs/shape_probe.json" > "$out/logs/shape_probe.log" 2>&1 || { cat "$out/logs/shape_probe.log" | tail -30; tar -C "$out" -czf "$out/logs.tgz" logs; exit 1; }
cat "$out/logs/shape_probe.log" | cut -c1-200
timeout 150 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider test/ops/mhc/test_hc_mix_stats.py \
  "test/sglang/test_gpu.py::test_mix_stats_of_a_v41_layer" > "$out/logs/mhc_tests.log" 2>&1
tail -n 4 "$out/logs/mhc_tests.log" | cut -c1-200
timeout 120 python3 -m benchmark.call_sites --sites mix_stats --json "$out/logs/call_sites.json" \
  > "$out/logs/call_sites.log" 2>&1
grep -v "StandIn" "$out/logs/call_sites.log" | cut -c1-110
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
