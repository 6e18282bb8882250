#!/usr/bin/env bash
# Session 8, call 3: variants of the TMA wgmma projection (what bounds a chunk).
set -u
out=${1:?OUT}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1
source benchmark/sglang_env/activate.sh > "$out/logs/activate.log" 2>&1 || exit 1
timeout 200 python3 out/probe8/var_probe.py "$out/logs/var_probe.json" > "$out/logs/var_probe.log" 2>&1
cat "$out/logs/var_probe.log" | cut -c1-200
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
