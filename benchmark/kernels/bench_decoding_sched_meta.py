"""FlashMLA-structured scheduler kernel (one warp, lane 0 walks) vs the block-parallel one.

Decode shapes of DeepSeek-V4.1 (64 heads, head dim 512): ``s_q`` 1 and 6 (DSpark verify rows),
so 132 and 22 partitions on an H200; top-k 2048 with an extra cache of 512, at long context
(every request has its full 2048 indices, extra lengths drawn in [128, 512]). CUDA-graph replay
medians (dsv41_kernels.timing.graph_time_us); the two outputs are checked equal first.
    python benchmark/kernels/bench_decoding_sched_meta.py --json bench_decoding_sched_meta.json
"""

from __future__ import annotations

import argparse
import json

import torch

from dsv41_kernels.ops.attention.decoding_sched_meta import (
    BLOCK_SIZE_N,
    baseline_decoding_sched_meta,
    decoding_sched_meta,
    decoding_sched_meta_admission,
    device_sched_config,
)
from dsv41_kernels.timing import graph_time_us

TOPK, EXTRA_TOPK, HEADS = 2048, 512, 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--batches", default="1,2,8,32,64")
    parser.add_argument("--s-q", default="1,6")
    args = parser.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    records = []
    for s_q in map(int, args.s_q.split(",")):
        parts, overhead = device_sched_config(device, s_q=s_q, h_q=HEADS)
        for b in map(int, args.batches.split(",")):
            lengths = {
                "topk_length": torch.full((b,), TOPK, dtype=torch.int32, device=device),
                "extra_topk_length": torch.randint(
                    128, EXTRA_TOPK + 1, (b,), generator=gen, dtype=torch.int32
                ).to(device),
            }
            config = dict(
                block_size_n=BLOCK_SIZE_N,
                fixed_overhead_num_blocks=overhead,
                topk=TOPK,
                extra_topk=EXTRA_TOPK,
                **lengths,
            )
            ours = (torch.empty(parts, 8, dtype=torch.int32, device=device),)
            ours += (torch.empty(b + 1, dtype=torch.int32, device=device),)
            before = tuple(torch.empty_like(t) for t in ours)
            decoding_sched_meta(*ours, **config)
            baseline_decoding_sched_meta(*before, **config)
            if not all(torch.equal(a, z) for a, z in zip(ours, before, strict=True)):
                raise AssertionError(f"outputs differ at b={b}, s_q={s_q}")
            record = {
                "op": "decoding_sched_meta",
                "batch": b,
                "s_q": s_q,
                "num_sm_parts": parts,
                "path": decoding_sched_meta_admission(*ours, **config).path,
                "baseline": "FlashMLA-structured <<<1, 32>>> kernel",
                "baseline_us": graph_time_us(
                    lambda out=before, kw=config: baseline_decoding_sched_meta(*out, **kw)
                ),
                "ours_us": graph_time_us(
                    lambda out=ours, kw=config: decoding_sched_meta(*out, **kw)
                ),
            }
            record["speedup"] = record["baseline_us"] / record["ours_us"]
            records.append(record)
    print(f"{'batch':>5} {'s_q':>4} {'parts':>6} {'baseline us':>12} {'ours us':>9} {'speedup':>8}")
    for r in records:
        print(
            f"{r['batch']:>5} {r['s_q']:>4} {r['num_sm_parts']:>6} {r['baseline_us']:>12.2f} "
            f"{r['ours_us']:>9.2f} {r['speedup']:>7.1f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
