"""A/B in one process: main's row argmax module (out/ab/row_argmax_old.so: no dependent launch),
variant A (out/ab/row_argmax_a.so: the current source with kRowEarlyStartMaxIdle = -1, so the
one-CTA-a-row grid never starts the next launch early) and the current module; fp32
[rows, 129280] argmax and the accept at bs x 6 rows, CUDA-graph medians (the best of 3, arms
alternating), outputs checked equal first. Run from the repository root:
python3 docs/results/h200/session15/probes/argmax_ab.py OUT.json"""

import json
import sys
from pathlib import Path

import torch
import tvm_ffi

from dsv41_kernels.jit import load_module
from dsv41_kernels.timing import graph_time_us

ARMS = {
    "old": tvm_ffi.load_module("out/ab/row_argmax_old.so"),
    "a": tvm_ffi.load_module("out/ab/row_argmax_a.so"),
    "new": load_module("row_argmax", 0),
}
VOCAB = 129280


def best_of(runs):
    times = {name: [] for name in runs}
    for _ in range(3):
        for name, run in runs.items():
            times[name].append(graph_time_us(run))
    return {name: min(t) for name, t in times.items()}, times


def report(what, same, best, times):
    ratios = "  ".join(f"{k} {v:7.2f}" for k, v in best.items())
    print(f"{what:18s} {ratios}  new/old {best['new'] / best['old']:.3f}  same {same}", flush=True)
    records.append({"what": what, "same": same, **best, "all": times})


records = []
for rows in (1, 6, 16, 64, 96, 112, 128, 192, 240, 256, 384):
    logits = torch.randn(rows, VOCAB, device="cuda")
    logits[0, 7] = float("nan")
    outs = {name: torch.empty(rows, dtype=torch.int64, device="cuda") for name in ARMS}
    for name, module in ARMS.items():
        module.row_argmax_cuda(logits, outs[name])
    same = all(torch.equal(o, logits.argmax(-1)) for o in outs.values())
    runs = {
        name: (lambda m=module, o=outs[name], x=logits: m.row_argmax_cuda(x, o))
        for name, module in ARMS.items()
    }
    report(f"argmax {rows}", same, *best_of(runs))

for bs in (1, 4, 16, 32, 64):
    rows = bs * 6
    logits = torch.randn(rows, VOCAB, device="cuda")
    candidates = logits.argmax(-1).view(bs, 6).clone()
    candidates[:, 3] += 1  # a rejection in every request
    cutoff = torch.empty(0, dtype=torch.int32, device="cuda")
    state = {}
    for name in ARMS:
        state[name] = [
            torch.empty(bs, dtype=torch.int32, device="cuda"),
            torch.empty(bs, dtype=torch.int64, device="cuda"),
            torch.empty(bs, dtype=torch.int32, device="cuda"),
            torch.full((16 * bs,), -1, dtype=torch.int64, device="cuda"),
            torch.zeros(bs, dtype=torch.int64, device="cuda"),
        ]
    for name, module in ARMS.items():
        module.accept_greedy_cluster(candidates, logits, cutoff, *state[name])
    same = all(
        all(torch.equal(a, b) for a, b in zip(state[name][:3], state["old"][:3], strict=True))
        for name in ARMS
    )
    args = (candidates, logits, cutoff)
    runs = {
        name: (lambda m=module, a=args, s=state[name]: m.accept_greedy_cluster(*a, *s))
        for name, module in ARMS.items()
    }
    report(f"accept bs {bs}", same, *best_of(runs))

Path(sys.argv[1] if len(sys.argv) > 1 else "argmax_ab.json").write_text(
    json.dumps(records, indent=1)
)
