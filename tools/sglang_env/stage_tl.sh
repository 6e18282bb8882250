#!/usr/bin/env bash
# The staging run for tilelang + z3 (README.md, "tilelang"): run with carry [".sglang_env_tl"],
#   bash tools/sglang_env/stage_tl.sh
# It checks .sglang_env_tl/ against its MANIFEST and unpacks it into SGLANG_ENV_SITE (default
# /tmp/site). The next run, while the machine is still warm (30 s), carries .sglang_env and
# sources activate.sh, which finds tilelang there (or .sglang_env_tl, still in the tree) and says so.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
"${PYTHON:-python3}" "$here/sglang_env.py" stage-tl "${SGLANG_ENV_TL_DIR:-$root/.sglang_env_tl}" \
    "${SGLANG_ENV_SITE:-/tmp/site}"
