"""Every hooked SGLang 0.5.23 call site, SGLang's own function against the plugin's, per row count.

The figures the built-in H200 policy is decided from (``dsv41-kernels calibrate
--from-records``: a hook declines where ours is not faster than SGLang's own function by the
margin). The call sites are driven by the package's drivers
(:data:`dsv41_kernels.calibration.drivers.SITES`, which ``dsv41-kernels calibrate`` drives on a
GPU too): each as its callers drive it, with SGLang's dispatch for DeepSeek-V4.1 on the GPU at
hand; the ``sglang-0.5.23`` arm takes our hooks out, the ``ours`` arm forces ours
(``DSV41_KERNELS_FORCE=all``) so both are timed at every row count. CUDA-graph replay,
median. Rows are the row counts the call sites see: 6 per request at verify for the accept,
the tokens of a forward for the mHC and the router, 6 per request for the scheduler. A record's
``op`` is the op the hook runs, ``call_site`` SGLang's function, ``rows`` its row count,
``error`` why an arm has no figure.

    python -m benchmark.call_sites --record [--sites accept_greedy,hc_combine_norm] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from benchmark import record as results
from benchmark.kernels.common import OURS_ARM, SGLANG_ARM, record, sgl_kernel_rmsnorm

from dsv41_kernels.calibration.drivers import SITES, inner_calls, measure
from dsv41_kernels.timing import graph_time_us


def timed(fn, rows):
    """One arm's CUDA-graph median at ``rows``."""
    return graph_time_us(fn, inner=inner_calls(rows), repeats=20 if rows <= 8192 else 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the records here")
    results.add_argument(parser)
    parser.add_argument("--sites", default=",".join(SITES), help="comma-separated ops")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("call_sites needs a CUDA GPU")
    os.environ["SGLANG_PLUGINS"] = "dsv41_kernels"
    os.environ["DSV41_KERNELS_FORCE"] = "all"  # time ours everywhere, measured-slower or not
    from sglang.srt.plugins import load_plugins

    load_plugins()
    device = torch.device("cuda")
    name = torch.cuda.get_device_name()
    records = []
    print(f"{name}: SGLang 0.5.23's call sites, its function against ours (CUDA-graph medians, us)")
    print(f"{'op':<22} {'shape':<44} {'sglang-0.5.23':>14} {'ours':>14} {'ratio':>6}")
    with sgl_kernel_rmsnorm():  # SGLang's RMSNorm branch where sgl_kernel is a stand-in
        for site in args.sites.split(","):
            for case in SITES[site].cases(device):
                op, shape, times = case.op, case.shape, {}
                for arm, us, why in measure(case, timed):
                    times[arm] = us
                    if why is not None:  # an arm that cannot run here, or ours declined
                        print(f"  {op} {shape} [{arm}]: {why}", file=sys.stderr)
                    fields = {"call_site": SITES[site].call_site, "rows": case.rows}
                    if op == "inverse_rope_quant_fp8":
                        fields["series"] = shape.split(":")[0].split(", ")[1]  # "TP 4"
                    if why is not None:
                        fields["error"] = why
                    records.append(record(op, shape, arm, us, **fields))
                base, ours = times[SGLANG_ARM], times[OURS_ARM]
                fmt = lambda us: "-" if us is None else f"{us:.2f}"
                ratio = "-" if None in (base, ours) else f"{ours / base:.3f}"
                print(
                    f"{op:<22} {shape:<44} {fmt(base):>14} {fmt(ours):>14} {ratio:>6}", flush=True
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "records": records}, f, indent=2)
    if args.record is not None:
        results.append(records, args.record)


if __name__ == "__main__":
    main()
