#!/usr/bin/env bash
# The router's source with the early start off (no griddepcontrol.launch_dependents: the next
# launch waits for the grid's end), exported as gate_notrigger_cuda; built for sm_90a into DIR.
# Usage: bash make_notrigger.sh DIR (from the repository root)
set -eu
dir=${1:?DIR}
sed -e 's/p.one_wave = one_wave(kernel, ctas, threads);/p.one_wave = false;/' \
    -e 's/moe_fused_gate_cuda/gate_notrigger_cuda/g' sgl-kernel/csrc/moe_fused_gate.cu > "$dir/gate_notrigger.cu"
grep -c "p.one_wave = false" "$dir/gate_notrigger.cu"
cp docs/results/h200/session12/probes/build.py "$dir/"
(cd "$dir" && python build.py gate_notrigger)
