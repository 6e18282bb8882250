#!/usr/bin/env bash
# Two variants of sgl-kernel/csrc/row_argmax.cu's accept, built for sm_90a into DIR with their
# exports renamed: accept_moved (the cluster kernel reads the request before its logits loads,
# where the working tree reads it after them: 31 registers a thread against 60 at 8 items) and
# accept_rows2 (that, and the one-CTA-a-row kernel for the accept from 96 rows at any count, in
# two waves past 264 rows). Usage: bash make_accept_variants.sh DIR (from the repository root)
set -eu
dir=${1:?DIR}
python3 - "$dir" <<'PY'
import sys
src = open("sgl-kernel/csrc/row_argmax.cu").read()
blk = """  RowRequest request{};
  if constexpr (ACCEPT) {
    if (rank == 0) request = begin_accept(a, row, tid);
  }
"""
assert blk in src
moved = src.replace(blk, "").replace("  const int full_end = vocab / kVec * kVec;\n", blk + "  const int full_end = vocab / kVec * kVec;\n", 1)
gate = """    constexpr auto rows_kernel = row_argmax_rows_kernel<T, kRowThreads, kRowUnroll, ACCEPT>;
    if (one_wave(rows_kernel, rows, kRowThreads)) {"""
assert gate in moved
rows2 = moved.replace(gate, gate.replace("if (one_wave(rows_kernel, rows, kRowThreads)) {", "if (ACCEPT || one_wave(rows_kernel, rows, kRowThreads)) {"))
for name, text in (("accept_moved", moved), ("accept_rows2", rows2)):
    for f in ("row_argmax_cuda", "accept_greedy_cluster", "row_argmax_cluster_shape", "row_argmax_rows_shape"):
        text = text.replace(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({f}, {f});", f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}_{f}, {f});")
    open(f"{sys.argv[1]}/{name}.cu", "w").write(text)
PY
cp docs/results/h200/session12/probes/build.py "$dir/"
for name in accept_moved accept_rows2; do
  (cd "$dir" && python build.py $name && mv build_$name/$name.so . && rm -rf build_$name)
done
