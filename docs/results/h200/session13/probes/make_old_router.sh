#!/usr/bin/env bash
# The router's source at REV (its kernel before this session's slot loop), exported as
# gate_old_cuda; built for sm_90a into DIR. Usage: bash make_old_router.sh REV DIR (from the
# repository root)
set -eu
rev=${1:?REV}
dir=${2:?DIR}
git show "$rev:sgl-kernel/csrc/moe_fused_gate.cu" | sed -e 's/moe_fused_gate_cuda/gate_old_cuda/g' > "$dir/gate_old.cu"
cp docs/results/h200/session12/probes/build.py "$dir/"
(cd "$dir" && python build.py gate_old && mv build_gate_old/gate_old.so . && rm -rf build_gate_old)
