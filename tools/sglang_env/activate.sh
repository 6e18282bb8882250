# Source at the start of a GPU run:  source tools/sglang_env/activate.sh && python3 ...
#
# Installs the carried wheels and SGLang's unmodified source (.sglang_env/) into SGLANG_ENV_SITE
# (default /tmp/site), tilelang + z3 too when .sglang_env_tl/ was staged (README.md), exposes the
# stand-ins (standins/standins.txt) whose real package is not importable, gives dsv41_kernels its
# entry point, exports PYTHONPATH=SITE:python:STANDINS (real packages before stand-ins) and prints
# one line saying what it set up. Every carried file is checked against its sha256 first.
# Idempotent: a second source in a warm machine reinstalls nothing. Fails loudly: it returns 1,
# and exits 1 in a non-interactive shell (a device run), so nothing runs on a broken setup.
#
# SGLANG_ENV_DIR (default REPO/.sglang_env; the CPU proof uses .sglang_env_py311),
# SGLANG_ENV_TL_DIR (default REPO/.sglang_env_tl), SGLANG_ENV_SITE, PYTHON (default python3).

_sglang_env_main() {
    local here root site py out
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" || return 1
    root="$(cd "$here/../.." && pwd)" || return 1
    site="${SGLANG_ENV_SITE:-/tmp/site}"
    py="${PYTHON:-python3}"
    # Drop what an earlier activation put on PYTHONPATH, so a second source is a no-op.
    local kept="" entry
    local IFS=:
    for entry in ${PYTHONPATH:-}; do
        case "$entry" in
            "$site" | "${site}_standins" | "$root/python" | "") ;;
            *) [[ -f "$entry/_sglang_env_standin.py" ]] || kept="${kept:+$kept:}$entry" ;;
        esac
    done
    unset IFS
    out="$(PYTHONPATH="$kept" "$py" "$here/sglang_env.py" activate \
        "${SGLANG_ENV_DIR:-$root/.sglang_env}" "${SGLANG_ENV_TL_DIR:-$root/.sglang_env_tl}" \
        "$site" "$here/standins")" || return 1
    export PYTHONPATH="$out${kept:+:$kept}"
}

if ! _sglang_env_main; then
    echo "sglang_env: activation FAILED (see above); nothing is set up" >&2
    unset -f _sglang_env_main
    if [[ $- != *i* ]]; then exit 1; fi
    return 1
fi
unset -f _sglang_env_main
