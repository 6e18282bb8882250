"""torch.argmax vs row_argmax, and SGLang's torch greedy accept vs the one-launch accept.

CUDA-graph replay medians (dsv41_kernels.timing.graph_time_us); one table; ``--json PATH``.
    python benchmark/kernels/bench_row_argmax.py --json row_argmax.json
"""

from __future__ import annotations

import argparse
import json

import torch

from dsv41_kernels import accept_greedy, row_argmax, row_argmax_admission
from dsv41_kernels.jit import load_module
from dsv41_kernels.ops.speculative import row_argmax as row_argmax_module
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy_torch
from dsv41_kernels.ops.speculative.row_argmax import launch as triton_row_argmax
from dsv41_kernels.timing import graph_time_us

VOCAB = 129280


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--rows", default="1,2,6,16,64,128,256")
    parser.add_argument("--sweep", action="store_true", help="also time other launch shapes")
    args = parser.parse_args()
    records = sweep() if args.sweep else []
    for rows in map(int, args.rows.split(",")):
        x = torch.randn(rows, VOCAB, device="cuda")
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        records.append(
            {
                "op": "row_argmax",
                "shape": f"[{rows}, {VOCAB}] fp32",
                "path": row_argmax_admission(x).path,
                "baseline": "torch.argmax",
                "baseline_us": graph_time_us(lambda x=x, o=out: torch.argmax(x, dim=-1, out=o)),
                "triton_us": graph_time_us(lambda x=x, o=out: triton_row_argmax(x, o)),
                "ours_us": graph_time_us(lambda x=x, o=out: row_argmax(x, out=o)),
            }
        )
    for bs in (1, 4):
        n = 6
        logits = torch.randn(bs * n, VOCAB, device="cuda")
        cand = torch.randint(0, VOCAB, (bs, n), device="cuda")
        cutoff = torch.full((bs,), n, dtype=torch.int32, device="cuda")
        out = (
            torch.empty(bs, dtype=torch.int32, device="cuda"),
            torch.empty(bs, dtype=torch.int64, device="cuda"),
            torch.empty(bs, dtype=torch.int32, device="cuda"),
        )
        records.append(
            {
                "op": "accept_greedy",
                "shape": f"bs {bs} x n {n} x {VOCAB} fp32, cutoff",
                "path": "kernel",
                "baseline": "torch.argmax + torch accept rule",
                "baseline_us": graph_time_us(lambda: accept_greedy_torch(cand, logits, cutoff)),
                "ours_us": graph_time_us(
                    lambda: accept_greedy(cand, logits, cutoff_verify_lens=cutoff, out=out)
                ),
            }
        )
    print("ours = the public op (cuda cluster kernel for row_argmax on sm_90+); triton = the")
    print("Triton kernel alone. CUDA-graph replay medians, us per call.")
    print(f"{'op':<14} {'shape':<36} {'baseline':>9} {'triton':>8} {'ours':>8} {'speedup':>8}")
    for r in records:
        if "baseline_us" not in r:
            continue
        r["speedup"] = r["baseline_us"] / r["ours_us"]
        triton = f"{r['triton_us']:.2f}" if "triton_us" in r else "-"
        print(
            f"{r['op']:<14} {r['shape']:<36} {r['baseline_us']:>9.2f} {triton:>8} "
            f"{r['ours_us']:>8.2f} {r['speedup']:>7.1f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "records": records}, f, indent=1)


def sweep() -> list[dict]:
    """Launch shapes of the CUDA cluster kernel and of the Triton accept, checked and timed."""
    records = []
    module = load_module("row_argmax")
    for rows in (1, 6, 64):
        x = torch.randn(rows, VOCAB, device="cuda")
        x[:, ::97] = x.max()  # ties everywhere
        ref = torch.argmax(x, dim=-1)
        out = torch.empty(rows, dtype=torch.int64, device="cuda")
        for threads, items in ((128, 16), (256, 8), (256, 16), (512, 4), (512, 8), (1024, 2)):
            run = lambda x=x, t=threads, i=items: module.row_argmax_cluster_shape(x, out, t, i)
            run()
            record = {"op": "sweep cluster", "shape": f"[{rows}, {VOCAB}] {threads}x{items}"}
            record["exact"] = bool(torch.equal(out, ref))
            record["us"] = graph_time_us(run)
            records.append(record)
            print(record, flush=True)
    n, default = 6, row_argmax_module.launch_config
    logits = torch.randn(n, VOCAB, device="cuda")
    cand = torch.randint(0, VOCAB, (1, n), device="cuda")
    out = tuple(
        torch.empty(1, dtype=d, device="cuda") for d in (torch.int32, torch.int64, torch.int32)
    )

    def run():  # the Triton accept itself: the public op takes the cluster kernel here
        triton_row_argmax(logits, candidates=cand, accept_out=out, n=n)
        return out

    try:
        for chunk, block, warps in (
            (2048, 1024, 4),
            (4096, 1024, 8),
            (4096, 2048, 8),
            (8192, 1024, 8),
        ):
            row_argmax_module.launch_config = lambda r, v, c=chunk, b=block, w=warps: (c, b, w)
            record = {"op": "sweep accept", "shape": f"[6, {VOCAB}] {chunk}/{block}/{warps}"}
            record["exact"] = all(
                torch.equal(a, b) for a, b in zip(run(), accept_greedy_torch(cand, logits))
            )
            record["us"] = graph_time_us(run)
            records.append(record)
            print(record, flush=True)
    finally:
        row_argmax_module.launch_config = default
    return records


if __name__ == "__main__":
    main()
