"""Session 11: the combine+norm kernel with 1-3 rows a CTA (each row's reduction order unchanged)
and the early start forced on/off, beside the production module, CUDA-graph medians; bitwise
checks against the production kernel (y, and the MXFP8 data and scales)."""
import json, sys
import torch, tvm_ffi
from dsv41_kernels.timing import graph_time_us
from dsv41_kernels.jit import load_module
from dsv41_kernels.cases.hc_combine_norm import example_inputs, mxfp8_outputs

probe = tvm_ffi.load_module("out/probe11/build_combine_probe/combine_probe.so")
prod = load_module("hc_combine_norm", 0)
H, EPS = 5120, 1e-6
out = []
for m in (6, 64, 96, 128, 160, 192, 256):
    x, pre, weight = example_inputs(m, H, torch.device("cuda"), seed=m)
    x[0, 7] = float("nan") if m == 6 else x[0, 7]
    y0 = torch.empty(m, H, dtype=torch.bfloat16, device="cuda")
    yq0, q0 = mxfp8_outputs(m, H, torch.device("cuda"))
    prod.hc_combine_norm_cuda(x, pre, weight, y0, y0, y0, EPS, False)
    prod.hc_combine_norm_cuda(x, pre, weight, yq0, q0.data.view(torch.uint8), q0.scales, EPS, True)
    base = graph_time_us(lambda: prod.hc_combine_norm_cuda(x, pre, weight, y0, y0, y0, EPS, False))
    out.append({"m": m, "arm": "production", "us": base})
    print(f"m {m:4d} production {base:.2f}", flush=True)
    for rows in (1, 2, 3):
        for early in (0, 1):
            y = torch.full_like(y0, 7)
            f = lambda: probe.combine_probe_shape(x, pre, weight, y, y, y, EPS, False, 4, 160, rows, early)
            f()
            yq, q = mxfp8_outputs(m, H, torch.device("cuda"))
            q.scales.fill_(0xAB)
            probe.combine_probe_shape(x, pre, weight, yq, q.data.view(torch.uint8), q.scales, EPS, True, 4, 160, rows, early)
            same = (torch.equal(y.view(torch.int16), y0.view(torch.int16)) and torch.equal(yq.view(torch.int16), yq0.view(torch.int16))
                    and torch.equal(q.data.view(torch.uint8), q0.data.view(torch.uint8)) and torch.equal(q.scales, q0.scales))
            us = graph_time_us(f)
            uq = graph_time_us(lambda: probe.combine_probe_shape(x, pre, weight, yq, q.data.view(torch.uint8), q.scales, EPS, True, 4, 160, rows, early))
            out.append({"m": m, "rows_a_cta": rows, "early": early, "us": us, "us_mxfp8": uq, "bitwise": same})
            print(f"m {m:4d} rows/CTA {rows} early {early}: {us:.2f} (mxfp8 {uq:.2f}) bitwise {same}", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
