"""``decoding_sched_meta`` against FlashMLA's one-warp scheduler and SGLang's own block kernel.

Decode shapes of DeepSeek-V4.1 (64 heads, head dim 512): ``s_q`` 1 and 6 (DSpark verify rows),
so 132 and 22 partitions on an H200; top-k 2048 with an extra cache of 512, at long context
(every request has its full 2048 indices, extra lengths drawn in [128, 512]). Arms:
``flashmla-structured`` (FlashMLA's one-warp walk, as our own kernel restates it),
``sglang-0.5.23`` (SGLang's own block kernel ``flashmla_sched_meta``, which its V4 backend runs
on Blackwell with 64 heads; on Hopper SGLang precomputes nothing and FlashMLA's own scheduler
runs inside the decode: ``benchmark/call_sites.py`` times that) and ``ours``; the outputs are
checked equal first (seven defined fields and ``num_splits``).
    python benchmark/kernels/bench_decoding_sched_meta.py --json bench_decoding_sched_meta.json
"""

from __future__ import annotations

import torch
from common import parser, report, sglang_arm, sglang_function, timed

from dsv41_kernels.cases.decoding_sched_meta import baseline_decoding_sched_meta
from dsv41_kernels.ops.attention.decoding_sched_meta import (
    DecodingSchedConfig,
    decoding_sched_meta,
    decoding_sched_meta_admission,
    device_sched_config,
)

TOPK, EXTRA_TOPK, HEADS = 2048, 512, 64


def measure(b: int, s_q: int, gen: torch.Generator) -> list[dict]:
    device = torch.device("cuda")
    parts, overhead = device_sched_config(device, s_q=s_q, h_q=HEADS)
    config = DecodingSchedConfig(
        topk=TOPK, extra_topk=EXTRA_TOPK, fixed_overhead_num_blocks=overhead
    )
    lengths = {
        "topk_length": torch.full((b,), TOPK, dtype=torch.int32, device=device),
        "extra_topk_length": torch.randint(
            128, EXTRA_TOPK + 1, (b,), generator=gen, dtype=torch.int32
        ).to(device),
    }
    ours = (torch.empty(parts, 8, dtype=torch.int32, device=device),)
    ours += (torch.empty(b + 1, dtype=torch.int32, device=device),)
    before = tuple(torch.empty_like(t) for t in ours)
    decoding_sched_meta(*ours, config, **lengths)
    baseline_decoding_sched_meta(*before, config, **lengths)
    exact = all(torch.equal(a, z) for a, z in zip(ours, before, strict=True))
    shape = f"b={b} s_q={s_q} parts={parts}"
    kernel = decoding_sched_meta_admission(*ours, config, **lengths).kernel
    sglang, why = sglang_function(
        "sglang.kernels.ops.attention.dsv4.flashmla_sched_meta", "flashmla_sched_meta"
    )
    theirs = tuple(torch.empty_like(t) for t in ours)
    run = lambda: sglang(
        *theirs,
        **lengths,
        block_size_n=config.block_size_n,
        fixed_overhead_num_blocks=overhead,
        topk=TOPK,
        extra_topk=EXTRA_TOPK,
    )
    same = sglang is not None and run() is None and torch.equal(theirs[0][:, :7], ours[0][:, :7])
    same = same and torch.equal(theirs[1], ours[1])
    return [
        sglang_arm("decoding_sched_meta", shape, sglang, why, run, exact=same),
        timed(
            "decoding_sched_meta",
            shape,
            "flashmla-structured",
            lambda: baseline_decoding_sched_meta(*before, config, **lengths),
            exact=exact,
        ),
        timed(
            "decoding_sched_meta",
            shape,
            "ours",
            lambda: decoding_sched_meta(*ours, config, **lengths),
            exact=exact,
            kernel=kernel,
        ),
    ]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batches", default="1,2,8,32,64")
    p.add_argument("--s-q", default="1,6")
    args = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    records = [
        r
        for s_q in map(int, args.s_q.split(","))
        for b in map(int, args.batches.split(","))
        for r in measure(b, s_q, gen)
    ]
    report(records, args.json, baseline="flashmla-structured")


if __name__ == "__main__":
    main()
