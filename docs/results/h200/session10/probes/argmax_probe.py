"""The one-CTA-a-row argmax kernel's shapes against the cluster kernel and SGLang's argmax."""
import json, sys
import torch
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.ops.speculative.argmax_reduction import cuda_module
from sglang.kernels.ops.speculative.dspark.dspark_accept import _row_argmax

V = 129280
SHAPES = ((256, 4), (256, 8), (512, 2), (512, 4), (1024, 2), (128, 8))
mod = cuda_module(torch.device("cuda"))
# exactness first: special values
bad = 0
g = torch.Generator(device="cuda").manual_seed(0)
for case in range(60):
    rows = [1, 7, 64, 130, 257][case % 5]
    x = torch.randn(rows, V, device="cuda", generator=g)
    kind = case % 6
    if kind == 1: x[:, ::101] = x.max()
    if kind == 2: x[torch.rand(rows, V, device="cuda", generator=g) < 1e-4] = float("nan")
    if kind == 3: x.fill_(float("-inf")); x[::2, -1] = 0.0
    if kind == 4: x[:, -3:] = float("inf"); x[:, 5] = float("inf")
    if kind == 5: x.zero_(); x[:, ::2] = -0.0; x[1::3, -1] = float("nan")
    ref = torch.argmax(x, -1)
    for t, u in SHAPES:
        o = torch.empty(rows, dtype=torch.int64, device="cuda")
        mod.row_argmax_rows_shape(x, o, t, u)
        bad += int((o != ref).sum())
print("mismatches", bad, flush=True)
rec = []
for rows in (64, 96, 128, 192, 256, 384):
    x = torch.randn(rows, V, device="cuda")
    o = torch.empty(rows, dtype=torch.int64, device="cuda")
    arms = {"sglang-0.5.23": lambda: _row_argmax(x, fused=True),
            "cluster (ours now)": lambda: mod.row_argmax_cluster(x, o)}
    for t, u in SHAPES:
        arms[f"rows {t}x{u}"] = lambda t=t, u=u: mod.row_argmax_rows_shape(x, o, t, u)
    for arm, f in arms.items():
        us = graph_time_us(f)
        rec.append({"rows": rows, "arm": arm, "us": us})
        print(f"{rows:4d} {arm:22s} {us:7.2f}", flush=True)
json.dump({"mismatches": bad, "records": rec}, open(sys.argv[1], "w"), indent=1)
