#!/usr/bin/env bash
# Build the carry folders that make SGLang 0.5.23's own, unmodified code importable and runnable
# on the GPU test machine (Python 3.12, torch 2.11, no network). Runs here, with PyPI reachable.
#
#   bash tools/sglang_env/build.sh            # .sglang_env/ (cp312) and .sglang_env_tl/
#   PYTHON_VERSION=3.11 bash tools/sglang_env/build.sh   # .sglang_env_py311/ for the CPU proof
#
# .sglang_env/     real wheels + SGLang's source (tar.xz, byte for byte, Rust extensions left out)
# .sglang_env_tl/  tilelang 0.1.12 + z3-solver 4.15.4.0, repacked (staged in a run of its own)
# Wheels are taken from SGLANG_ENV_WHEELHOUSE (a folder of cp312 wheels, optional) or the cache
# (SGLANG_ENV_CACHE, default ~/.cache/dsv41-kernels/sglang_env), else downloaded from PyPI.
# Idempotent; fails loudly. What is carried and why: tools/sglang_env/README.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYV="${PYTHON_VERSION:-3.12}"
TAG="cp${PYV/./}"
CACHE="${SGLANG_ENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dsv41-kernels/sglang_env}"
WHEELHOUSE="${SGLANG_ENV_WHEELHOUSE:-}"
if [[ "$PYV" == 3.12 ]]; then OUT="$ROOT/.sglang_env"; else OUT="$ROOT/.sglang_env_py${PYV/./}"; fi
TL_OUT="$ROOT/.sglang_env_tl" # tilelang (abi3) and z3 (py3-none) serve every Python
PY="${PY:-python3}"
die() { echo "build.sh: ERROR: $*" >&2; exit 1; }

SGLANG=sglang==0.5.23
# Real packages that the SGLang paths import and that the GPU machine lacks. Versions: those
# SGLang 0.5.23's own requirements resolve to (as .ci/install_sglang_cpu.sh installs them).
WHEELS=(
    # called, or their objects used, at import time
    orjson==3.13.0 msgspec==0.23.0 pybase64==1.5.1 dill==0.4.1
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2
    openai==2.8.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1
    # imported unconditionally; small enough that the real one beats a stand-in
    pyzmq==27.3.0 uvicorn==0.54.0 setproctitle==1.3.8 partial-json-parser==0.2.1.1.post7
    compressed-tensors==0.18.0 loguru==0.7.3 gguf==0.19.0
    # probed (try/except) by torch.cuda and SGLang; a real SGLang install has it (nvidia-ml-py)
    nvidia-ml-py==13.615.71
    # run on the GPU: SGLang's FlashMLA wrapper and the JIT of flashmla_sched_meta/dsv41_kernels
    sgl-flash-mla==1.0.0 apache-tvm-ffi==0.1.11
)
TL_WHEELS=(tilelang==0.1.12 z3-solver==4.15.4.0)
# Real pure-Python files of a stood-in package, carried byte for byte (standins/standins.txt).
VERBATIM_WHEEL=sglang-kernel==0.4.10 # 373 MB, fetched once into the cache; abi3, any Python
VERBATIM_FILES=(sgl_kernel/scalar_type.py sgl_kernel/utils.py)

# fetch PYVER SPEC...: echo the path of each wheel (wheelhouse, cache, else PyPI into the cache)
fetch() {
    local PYV="$1" TAG="cp${1/./}" spec name ver norm found missing=()
    shift
    mkdir -p "$CACHE/$TAG"
    for spec in "$@"; do
        name="${spec%%==*}"; ver="${spec##*==}"; norm="${name//-/_}"
        found=""
        for dir in "$WHEELHOUSE" "$CACHE/$TAG"; do
            [[ -n "$dir" ]] || continue
            [[ "$PYV" == 3.12 || "$dir" != "$WHEELHOUSE" ]] || continue
            found="$(ls "$dir"/"$norm"-"$ver"-*.whl 2>/dev/null | grep -E -- "-(py3|$TAG|cp3[0-9]*-abi3|cp38-abi3)" | head -n 1 || true)"
            [[ -n "$found" ]] && break
        done
        if [[ -z "$found" ]]; then missing+=("$spec"); else echo "$found"; fi
    done
    if ((${#missing[@]})); then
        "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version "$PYV" \
            --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d "$CACHE/$TAG" "${missing[@]}" >&2 \
            || die "pip download failed for: ${missing[*]}"
        for spec in "${missing[@]}"; do
            name="${spec%%==*}"; ver="${spec##*==}"; norm="${name//-/_}"
            found="$(ls "$CACHE/$TAG"/"$norm"-"$ver"-*.whl 2>/dev/null | head -n 1 || true)"
            [[ -n "$found" ]] || die "no wheel for $spec after download"
            echo "$found"
        done
    fi
}

start=$(date +%s)
mapfile -t wheels < <(fetch "$PYV" "${WHEELS[@]}")
((${#wheels[@]} == ${#WHEELS[@]})) || die "expected ${#WHEELS[@]} wheels, got ${#wheels[@]}"
# SGLang's Python source is the same in every wheel; the GPU's (cp312) one serves the proof too.
sglang_wheel="$(fetch 3.12 "$SGLANG")"

rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp/wheels"
cp "${wheels[@]}" "$OUT.tmp/wheels/"
# Packing takes a minute: the result is kept in the cache, keyed by the wheel's and packer's hash.
packed="$CACHE/packed/$(cat "$sglang_wheel" "$HERE/sglang_env.py" | sha256sum | cut -c1-16)"
if [[ ! -f "$packed/sglang-0.5.23.tar.xz" ]]; then
    mkdir -p "$packed.tmp"
    "$PY" "$HERE/sglang_env.py" pack-sglang "$sglang_wheel" "$packed.tmp/sglang-0.5.23.tar.xz"
    rm -rf "$packed" && mv "$packed.tmp" "$packed"
fi
cp "$packed"/sglang-0.5.23.tar.xz* "$OUT.tmp/"
"$PY" "$HERE/sglang_env.py" extract "$(fetch 3.12 "$VERBATIM_WHEEL")" "$OUT.tmp/verbatim" \
    "${VERBATIM_FILES[@]}"
"$PY" "$HERE/sglang_env.py" manifest "$OUT.tmp"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"

if [[ ! -f "$TL_OUT/MANIFEST.txt" || -n "${SGLANG_ENV_REBUILD_TL:-}" ]]; then
    mapfile -t tl_wheels < <(fetch 3.12 "${TL_WHEELS[@]}")
    rm -rf "$TL_OUT.tmp" && mkdir -p "$TL_OUT.tmp"
    # ROCm's Composable Kernel headers (44 MB) serve only tilelang's HIP backend.
    "$PY" "$HERE/sglang_env.py" pack-tree "${tl_wheels[0]}" "$TL_OUT.tmp/tilelang-0.1.12.tar.xz" \
        tilelang/3rdparty/composable_kernel/
    # The z3 command-line program (22 MB); the Python bindings and libz3 are kept.
    "$PY" "$HERE/sglang_env.py" pack-tree "${tl_wheels[1]}" "$TL_OUT.tmp/z3_solver-4.15.4.0.tar.xz" \
        z3_solver-4.15.4.0.data/
    "$PY" "$HERE/sglang_env.py" manifest "$TL_OUT.tmp"
    rm -rf "$TL_OUT" && mv "$TL_OUT.tmp" "$TL_OUT"
fi

main_bytes=$(tail -n 1 "$OUT/MANIFEST.txt" | awk '{print $2}')
(( main_bytes <= 50 * 1024 * 1024 )) || die "$OUT is $main_bytes bytes, over the 50 MiB budget"
tl_bytes=$(tail -n 1 "$TL_OUT/MANIFEST.txt" | awk '{print $2}')
tree_bytes=$(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
both=$(( (main_bytes + tl_bytes + tree_bytes) / 1024 ))
if (( both < 63 * 1024 )); then fits="fits"; else fits="does NOT fit: stage tilelang (README.md)"; fi
echo "build.sh: tree + $(basename "$OUT") + $(basename "$TL_OUT") = $((both / 1024)) MiB of 64: one run $fits"
echo "build.sh: $(basename "$OUT") $(tail -n 1 "$OUT/MANIFEST.txt" | cut -d'(' -f2 | tr -d ')')," \
    "$(basename "$TL_OUT") $(tail -n 1 "$TL_OUT/MANIFEST.txt" | cut -d'(' -f2 | tr -d ')')," \
    "in $(( $(date +%s) - start )) s"
