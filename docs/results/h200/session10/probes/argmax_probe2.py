"""Cluster kernel against the Triton kernel (the op's choice past 8 rows) and SGLang's argmax,
9..96 rows."""
import json, sys
import torch
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.ops.speculative.argmax_reduction import cuda_module
from dsv41_kernels.ops.speculative.row_argmax import launch_triton
from sglang.kernels.ops.speculative.dspark.dspark_accept import _row_argmax

V = 129280
mod = cuda_module(torch.device("cuda"))
rec = []
for rows in (8, 12, 16, 24, 32, 48, 64, 96):
    x = torch.randn(rows, V, device="cuda")
    o = torch.empty(rows, dtype=torch.int64, device="cuda")
    arms = {"sglang-0.5.23": lambda: _row_argmax(x, fused=True),
            "cluster": lambda: mod.row_argmax_cluster(x, o),
            "triton": lambda: launch_triton(x, o),
            "rows 1024x2": lambda: mod.row_argmax_rows_shape(x, o, 1024, 2)}
    for arm, f in arms.items():
        f(); ok = bool((o == x.argmax(-1)).all()) if arm != "sglang-0.5.23" else True
        us = graph_time_us(f)
        rec.append({"rows": rows, "arm": arm, "us": us, "exact": ok})
        print(f"{rows:4d} {arm:16s} {us:7.2f} {ok}", flush=True)
json.dump(rec, open(sys.argv[1], "w"), indent=1)
