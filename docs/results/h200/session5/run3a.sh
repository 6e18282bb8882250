#!/usr/bin/env bash
# Fifth session, third device call: the final wheel (six modules, the CUDA router new) without
# nvcc: its GPU tier (test/ops) and check; then, from the checkout with the same prebuilt
# modules, the SGLang-caller tests run2 did not reach (its tier stopped at 400 s with no
# failure) and the router hook's. Usage: bash .../run3a.sh OUT
set -u
out=${1:?OUT}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
STEPS=tier timeout 300 bash benchmark/prebuilt_h200.sh "$out/pb" > "$out/pb.out" 2>&1
tail -n 6 "$out/pb.out" | cut -c1-200
source benchmark/sglang_env/activate.sh > "$out/activate.log" 2>&1 || { cat "$out/activate.log"; exit 1; }
timeout 170 python3 -m pytest -m gpu -q -rs -p no:cacheprovider --durations=5 \
  test/sglang/test_gpu_wo_a.py test/sglang/test_gpu_flashmla.py test/sglang/test_gpu.py \
  -k "test_gpu_wo_a or other_shapes or lengths[64 or vision_router" > "$out/sglang_tests.log" 2>&1
tail -n 12 "$out/sglang_tests.log" | cut -c1-200
