#!/usr/bin/env bash
# The prebuilt wheel on a GPU machine, in one go. It installs the wheel built on the CPU machine
# into a bare folder and, with no nvcc on PATH and CUDA_HOME unset:
#   1. checks that the install is what Python imports and that every CUDA module is at hand
#      prebuilt for this GPU;
#   2. runs the GPU tier (pytest -m gpu test/ops) and `dsv41-kernels check` against it: every
#      op exact, every CUDA module loaded prebuilt, nothing built (the cache stays empty);
#   3. times each op's first call (benchmark/first_call.py), in one process and in PROCESSES
#      processes started at once;
# then, with nvcc and no prebuilt modules, the same first calls on a cold just-in-time cache (one
# process, then PROCESSES at once on another cold cache), and from the warm cache.
#
# Usage, from the repository root: bash benchmark/prebuilt_h200.sh OUT_DIR
# .prebuilt/ (git-ignored: carry it) holds the wheel (README, "A wheel with the CUDA modules
# prebuilt": python -m build --wheel --outdir .prebuilt) and the apache-tvm-ffi wheel it was
# built against (SGLang 0.5.23's pin: apache_tvm_ffi-0.1.11-*.whl). PROCESSES defaults to 8.
# STEPS (default "tier first jit") picks steps 1-2, 3 and 4, to split a run in two.
set -uo pipefail
out=$(realpath -m "${1:?usage: prebuilt_h200.sh OUT_DIR}")
cd "$(dirname "$0")/.."
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
processes=${PROCESSES:-8}
steps=" ${STEPS:-tier first jit} "
status=0
fail() { echo "FAILED: $*" | tee -a "$out/prebuilt.log"; status=1; }

python3 -m pip install --quiet --no-index --no-deps --target "$work/site" \
  .prebuilt/dsv41_kernels-*.whl .prebuilt/apache_tvm_ffi-*.whl || { echo "install failed"; exit 1; }
export PYTHONPATH="$work/site" PYTHONUNBUFFERED=1 TVM_FFI_CACHE_DIR="$work/tvm-ffi-cache"
no_nvcc_path=$(python3 -c 'import os; print(os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(d, "nvcc"))))')
without_nvcc() {
  env -u CUDA_HOME -u CUDA_PATH PATH="$no_nvcc_path" DSV41_KERNELS_CACHE="$work/no-builds" \
    TRITON_CACHE_DIR="$work/triton-$1" "${@:2}"
}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  ls -l .prebuilt/
} | tee "$out/prebuilt.log"

echo "== 1. the install, no nvcc" | tee -a "$out/prebuilt.log"  # always: the rest relies on it
without_nvcc modules python3 - "$work/site" <<'PY' 2>&1 | tee -a "$out/prebuilt.log" || fail "modules at hand"
import shutil, sys
from pathlib import Path
from dsv41_kernels import jit
assert shutil.which("nvcc") is None, shutil.which("nvcc")
assert Path(jit.__file__).is_relative_to(sys.argv[1]), jit.__file__
print("dsv41_kernels from", jit.PACKAGE, "| apache-tvm-ffi", jit.tvm_ffi_version())
missing = []
for name in jit.module_names():
    found = jit.module_available(name, 0)
    print(f"{name:20} {found.source}: {found.reason}")
    missing += [name] * (found.source != jit.PREBUILT_SOURCE)
sys.exit(f"not prebuilt: {missing}" if missing else 0)
PY

if [[ $steps == *" tier "* ]]; then
echo "== 2. GPU tier and check, no nvcc" | tee -a "$out/prebuilt.log"
without_nvcc tests timeout 600 python3 -m pytest -m gpu -q -rs -p no:cacheprovider test/ops \
  > "$out/gpu_tests_prebuilt.log" 2>&1 || fail "GPU tier"
tail -n 3 "$out/gpu_tests_prebuilt.log" | tee -a "$out/prebuilt.log"
without_nvcc check timeout 300 python3 -m dsv41_kernels.cli check --json \
  > "$out/check_prebuilt.jsonl" 2>> "$out/prebuilt.log" || fail "dsv41-kernels check"
python3 - "$out/check_prebuilt.jsonl" <<'PY' 2>&1 | tee -a "$out/prebuilt.log" || fail "check's module column"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
for r in records:
    print(f"{r['op']:22} {r['path']:8} {str(r['module']):9} exact={r['exact']}  {r['reason'][:90]}")
modules = {r["module"] for r in records}
assert records and all(r["exact"] for r in records), "an op is inexact"
assert modules - {None} == {"prebuilt"}, f"module sources: {modules}"
PY
[ ! -e "$work/no-builds" ] || fail "a module was built or cached: $(ls -R "$work/no-builds")"
fi

if [[ $steps == *" first "* ]]; then
echo "== 3. first calls, prebuilt, no nvcc" | tee -a "$out/prebuilt.log"
without_nvcc first-1 python3 benchmark/first_call.py --expect prebuilt \
  --json "$out/first_call_prebuilt.json" 2>&1 | tee -a "$out/prebuilt.log" || fail "prebuilt first calls"
without_nvcc first-n python3 benchmark/first_call.py --expect prebuilt --processes "$processes" \
  --json "$out/first_call_prebuilt_x$processes.json" 2>&1 | tee -a "$out/prebuilt.log" \
  || fail "prebuilt first calls, $processes processes"
fi

if [[ $steps == *" jit "* ]]; then
echo "== 4. first calls, cold just-in-time builds (nvcc: $(command -v nvcc))" | tee -a "$out/prebuilt.log"
jit_only() {
  DSV41_KERNELS_PREBUILT="$work/no-prebuilt" DSV41_KERNELS_CACHE="$work/$1" \
    TRITON_CACHE_DIR="$work/triton-$1" python3 benchmark/first_call.py "${@:2}" 2>&1 \
    | tee -a "$out/prebuilt.log"
}
jit_only cache-1 --expect "built now" --json "$out/first_call_jit_cold.json" || fail "cold JIT"
# a process arriving after another's build was published loads it from the cache
jit_only cache-n --expect "built now,cached" --processes "$processes" \
  --json "$out/first_call_jit_cold_x$processes.json" || fail "cold JIT, $processes processes"
jit_only cache-1 --expect cached --json "$out/first_call_jit_cached.json" || fail "cached JIT"
ls "$work/cache-n" | tee -a "$out/prebuilt.log"  # per module: its build folder and its module
fi

echo "tvm-ffi's own cache (its optional torch addon): $(ls "$work/tvm-ffi-cache" 2>/dev/null)" \
  | tee -a "$out/prebuilt.log"
[ "$status" = 0 ] && echo "prebuilt_h200: all passed" | tee -a "$out/prebuilt.log"
exit $status
