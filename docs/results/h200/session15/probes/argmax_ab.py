"""A/B in one process: the row argmax before (out/ab/row_argmax_old.so, main's module) and after
its kernels became dependent launches (the current module), fp32 [rows, 129280], CUDA-graph
medians, alternating arms; same indices checked first. Run from the repository root:
python3 docs/results/h200/session15/probes/argmax_ab.py"""

import json
import sys
from pathlib import Path

import torch
import tvm_ffi

from dsv41_kernels.jit import load_module
from dsv41_kernels.timing import graph_time_us

old = tvm_ffi.load_module("out/ab/row_argmax_old.so")
new = load_module("row_argmax", 0)
records = []
for rows in (1, 6, 16, 64, 96, 128, 192, 256, 384):
    logits = torch.randn(rows, 129280, device="cuda", generator=None)
    logits[0, 7] = float("nan")
    outs = {name: torch.empty(rows, dtype=torch.int64, device="cuda") for name in ("old", "new")}
    old.row_argmax_cuda(logits, outs["old"])
    new.row_argmax_cuda(logits, outs["new"])
    same = torch.equal(outs["old"], outs["new"]) and torch.equal(outs["new"], logits.argmax(-1))
    times = {"old": [], "new": []}
    for _ in range(3):
        times["old"].append(
            graph_time_us(lambda x=logits, o=outs: old.row_argmax_cuda(x, o["old"]))
        )
        times["new"].append(
            graph_time_us(lambda x=logits, o=outs: new.row_argmax_cuda(x, o["new"]))
        )
    best = {k: min(v) for k, v in times.items()}
    records.append(
        {"rows": rows, "same": same, **best, "old_all": times["old"], "new_all": times["new"]}
    )
    print(
        f"rows {rows:4d}  old {best['old']:7.2f}  new {best['new']:7.2f}  "
        f"new/old {best['new'] / best['old']:.3f}  same {same}",
        flush=True,
    )
Path(sys.argv[1] if len(sys.argv) > 1 else "argmax_ab.json").write_text(
    json.dumps(records, indent=1)
)
