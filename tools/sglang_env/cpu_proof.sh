#!/usr/bin/env bash
# The CPU-side proof (README.md, "Proof on a CPU machine"): a venv resembling the GPU machine's
# package set, the same carry (cp311 wheels) and stand-ins through the same scripts, then every
# module imported (plain and --fake-cuda) and the plugin's CPU tests.
#   bash tools/sglang_env/cpu_proof.sh [VENV]       (default /tmp/sglang_env_proof_venv)
# TRITON=3.9.0 runs the tests with CI's Triton instead of the GPU machine's 3.6.0.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${1:-/tmp/sglang_env_proof_venv}"
if [[ ! -x "$venv/bin/python" ]]; then
    python3.11 -m venv "$venv"
    "$venv/bin/pip" install -q torch==2.13.0 # the CPU build on disk
    # From the GPU machine's list, the versions it names where a cp311 build exists.
    "$venv/bin/pip" install -q "triton==${TRITON:-3.6.0}" "numpy<2.5" transformers==5.17.0 \
        tokenizers==0.23.2 safetensors==0.8.0 huggingface-hub==1.33.0 requests psutil aiohttp \
        pyyaml pillow einops sentencepiece tiktoken uvloop scipy numba prometheus-client xxhash \
        msgpack cloudpickle protobuf cuda-bindings cuda-core cuda-pathfinder ml-dtypes ninja \
        cython accelerate timm tabulate colorama opt-einsum simplejson scikit-learn pandas \
        python-dateutil pytest hypothesis pytest-timeout
    "$venv/bin/pip" install -q --no-deps torchvision==0.28.0
    # The GPU machine has no pydantic (typer pulls it in here).
    "$venv/bin/pip" uninstall -q -y pydantic pydantic-core annotated-types typing-inspection
    "$venv/bin/pip" install -q --no-deps -e "$root"
fi
PYTHON_VERSION=3.11 bash "$here/build.sh"
export PATH="$venv/bin:$PATH" PYTHON="$venv/bin/python"
unset PYTHONPATH
SGLANG_ENV_DIR="$root/.sglang_env_py311" SGLANG_ENV_TL_DIR=/nonexistent \
    SGLANG_ENV_SITE=/tmp/sglang_env_proof_site source "$here/activate.sh"
cd "$root"
python "$here/check_imports.py"
python "$here/check_imports.py" --fake-cuda
TRITON_INTERPRET=1 DSV41_KERNELS_REQUIRE_SGLANG=1 python -m pytest -q test/sglang -p no:cacheprovider
