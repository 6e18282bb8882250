#!/usr/bin/env bash
# Fifth session, fifth device call: the combine kernel's early trigger decided by the clusters
# the GPU places at once (cudaOccupancyMaxActiveClusters), after run3b measured 128 rows at
# 3.46 us against 2.83 without the trigger. The combine's GPU tests, SGLang's caller, then the
# combine call site. Usage: bash .../run4.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
timeout 90 python3 -m pytest -m gpu -q -rs -p no:cacheprovider test/ops/mhc/test_hc_combine_norm.py \
  test/sglang/test_gpu.py -k "combine" > "$out/combine_tests.log" 2>&1
tail -n 3 "$out/combine_tests.log" | cut -c1-200
timeout 90 python3 -m benchmark.call_sites --sites combine --json "$out/call_sites.json" \
  > "$out/call_sites.log" 2>&1
grep -v "StandIn" "$out/call_sites.log" | cut -c1-110
