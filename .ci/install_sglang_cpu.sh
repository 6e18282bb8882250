#!/usr/bin/env bash
# Install the real SGLang 0.5.23 into an existing CPU-only Python environment, so that the
# plugin tests (test/sglang) run against SGLang's own code without a GPU.
#
# SGLang 0.5.23 pins a CUDA build of torch 2.14.1 and several CUDA-only kernel packages. On a
# CPU machine we keep the CPU build of torch 2.13.0 that the environment already has, install
# SGLang's other requirements under the constraint torch==2.13.0, then SGLang itself without
# dependencies (docs/sglang.md, "Tests against the real SGLang").
#
# Environment: PYTHON (default: python) names the interpreter of the environment to install
# into; SGLANG_CPU_CACHE (default: ~/.cache/dsv41-kernels/sglang-cpu) holds the downloaded wheel.
# Idempotent: a second run with everything in place only re-checks the import. Fails loudly.
set -euo pipefail

PYTHON="${PYTHON:-python}"
SGLANG_VERSION="0.5.23"
TORCH_VERSION="2.13.0"
CACHE="${SGLANG_CPU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dsv41-kernels/sglang-cpu}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIP=("$PYTHON" -m pip)

die() { echo "install_sglang_cpu: $*" >&2; exit 1; }
installed_version() {
    "$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" \
        2>/dev/null || true
}

start=$(date +%s)
torch_version="$(installed_version torch)"
[[ "${torch_version%%+*}" == "$TORCH_VERSION" ]] \
    || die "expected torch $TORCH_VERSION (CPU build) in $PYTHON's environment, found '${torch_version:-none}'"

if [[ "$(installed_version sglang)" != "$SGLANG_VERSION" ]]; then
    mkdir -p "$CACHE"
    wheel="$(ls "$CACHE"/sglang-"$SGLANG_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
    if [[ -z "$wheel" ]]; then
        "${PIP[@]}" download --quiet --no-deps --dest "$CACHE" "sglang==$SGLANG_VERSION"
        wheel="$(ls "$CACHE"/sglang-"$SGLANG_VERSION"-*.whl | head -n 1)"
    fi
    [[ -f "$wheel" ]] || die "could not obtain the sglang $SGLANG_VERSION wheel"

    # SGLang's own requirement list minus the CUDA builds (the torch family and SGLang's
    # compiled kernel packages). Its apache-tvm-ffi pin (0.1.11, which tilelang also needs) is
    # kept: it is what a real SGLang 0.5.23 server runs with.
    "$PYTHON" - "$wheel" "$CACHE/requirements.txt" <<'PY'
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SKIP = {"torch", "torchaudio", "torchvision", "torchcodec", "sglang-kernel", "sgl-deep-ep",
        "sgl-flash-mla", "sgl-deep-gemm"}
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = zf.read(name).decode()
kept = []
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) not in SKIP:
        kept.append(str(req))
if not kept:
    sys.exit("no requirements found in the sglang wheel's METADATA")
with open(out, "w") as f:
    f.write("\n".join(kept) + "\n")
print(f"install_sglang_cpu: {len(kept)} requirements of {name.split('/')[0]}")
PY
    printf 'torch==%s\n' "$TORCH_VERSION" > "$CACHE/constraints.txt"
    "${PIP[@]}" install --quiet -r "$CACHE/requirements.txt" -c "$CACHE/constraints.txt"
    "${PIP[@]}" install --quiet --no-deps "$wheel"
fi

torch_version="$(installed_version torch)"
[[ "${torch_version%%+*}" == "$TORCH_VERSION" ]] \
    || die "torch changed to '$torch_version' while installing sglang's requirements"
# The import check the tests rely on (with the torchvision schemas the CPU tier defines).
"$PYTHON" "$ROOT/test/sglang/cpu_import.py"
echo "install_sglang_cpu: sglang $SGLANG_VERSION ready in $(( $(date +%s) - start )) s"
