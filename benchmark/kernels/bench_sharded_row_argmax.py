"""The greedy verify's argmax under tensor parallelism: all-gather + argmax vs sharded_row_argmax.

DSpark's verify rows are ``[rows, 129280]`` fp32 (6 a request: rows 6..384 for bs 1..64); at
TP ``tp`` each rank holds ``[rows, 129280 / tp]``.

One GPU (the default): the local part alone, what each rank runs besides its collective.
``ours (keys + merge)`` is this rank's :func:`shard_keys` (its row_argmax, then the key step)
on a ``[rows, 129280 / tp]`` shard into its row of a ``[tp, rows]`` key buffer, then the merge
of that buffer (:func:`merge_keys`); against it, the local part of SGLang 0.5.23's path, an argmax
of the all-gathered ``[rows, 129280]``: ``sglang-0.5.23`` (``_row_argmax(logits, fused=True)``,
what DeepSeek-V4.1's verify calls), ``row_argmax (gathered)`` (ours, what the accept hook runs
today) and ``torch.argmax (gathered)``. Every rank's keys are checked to merge into
torch.argmax of the full rows first.

``--world N`` (N GPUs): N NCCL ranks, rank 0 reporting; the collective included.
``all-gather + row_argmax`` (every rank's ``[rows, 129280 / N]`` gathered, laid out as full rows,
then row_argmax) against ``sharded_row_argmax``; both checked equal to torch.argmax first.
    python benchmark/kernels/bench_sharded_row_argmax.py --json bench_sharded_row_argmax.json
    python benchmark/kernels/bench_sharded_row_argmax.py --world 4 --json bench_sharded_tp4.json
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from common import SGLANG_ARM, parser, record, report, sglang_arm, sglang_function, timed

from dsv41_kernels.cases.sharded_row_argmax import even_widths, gathered_keys, shards
from dsv41_kernels.ops.speculative.row_argmax import row_argmax
from dsv41_kernels.ops.speculative.sharded_row_argmax import (
    all_gather_into,
    merge_keys,
    shard_keys,
    sharded_row_argmax,
)

VOCAB = 129280
ROWS = "6,12,24,48,96,192,384"  # bs 1, 2, 4, 8, 16, 32, 64 at 6 verify rows a request
# NVLink multicast stays off, in every rank too (KINDS.md).
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def local_part(rows: int, tp: int) -> list[dict]:
    full = torch.randn(rows, VOCAB, device="cuda")
    widths = even_widths(VOCAB, tp)
    shard = full[:, : widths[0]].contiguous()  # a rank's own lm_head output
    keys = gathered_keys(full, widths)  # every rank's keys, where the all-gather leaves them
    out = torch.empty(rows, dtype=torch.int64, device="cuda")
    shape = f"[{rows}, {VOCAB}] fp32, tp {tp}"
    op = "sharded_row_argmax local"
    sglang, why = sglang_function(
        "sglang.kernels.ops.speculative.dspark.dspark_accept", "_row_argmax"
    )
    ref = torch.argmax(full, dim=-1)
    run = lambda: sglang(full, fused=True)
    sglang_exact = sglang is not None and torch.equal(run(), ref)
    records = [sglang_arm(op, shape, sglang, why, run, exact=sglang_exact)]
    arms = {
        "torch.argmax (gathered)": lambda: torch.argmax(full, dim=-1, out=out),
        "row_argmax (gathered)": lambda: row_argmax(full, out=out),
    }
    for arm, run in arms.items():
        run()
        records.append(timed(op, shape, arm, run, exact=torch.equal(out, ref)))

    def keys_and_merge():
        shard_keys(shard, vocab_start=0, out=keys[0])
        return merge_keys(keys, out=out)

    exact = torch.equal(keys_and_merge(), ref)  # every rank's keys merge into torch.argmax
    records.append(timed(op, shape, "ours (keys + merge)", keys_and_merge, exact=exact))
    return records


def collective(rank: int, world: int, rows: int, group) -> list[dict]:
    device = torch.device("cuda", rank)
    widths = even_widths(VOCAB, world)
    gen = torch.Generator().manual_seed(rows)
    full = torch.randn(rows, VOCAB, generator=gen)
    start, mine = shards(full, widths)[rank]
    shard = mine.contiguous().to(device)
    gathered = torch.empty(world, rows, widths[0], device=device)
    logits = torch.empty(rows, VOCAB, device=device)
    out = torch.empty(rows, dtype=torch.int64, device=device)

    def gather_then_argmax():
        all_gather_into(gathered.view(-1, widths[0]), shard, group=group)
        logits.view(rows, world, widths[0]).copy_(gathered.transpose(0, 1))  # full rows
        return row_argmax(logits, out=out)

    ref = torch.argmax(full, dim=-1)
    arms = {
        "all-gather + row_argmax": gather_then_argmax,
        "sharded_row_argmax": lambda: sharded_row_argmax(
            shard, vocab_start=start, group=group, out=out
        ),
    }
    records = []
    shape = f"[{rows}, {VOCAB}] fp32, tp {world}"
    for arm, run in arms.items():
        run()
        exact = torch.equal(out.cpu(), ref)
        records.append(timed("sharded_row_argmax", shape, arm, run, exact=exact))
    return records


def collective_rank(rank: int, world: int, store: str, rows: list[int], queue) -> None:
    os.environ.update(NO_MULTICAST)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        group = dist.new_group(list(range(world)))
        records = [r for n in rows for r in collective(rank, world, n, group)]
        if rank == 0:
            queue.put(records)
    finally:
        dist.destroy_process_group()


def run_collective(world: int, rows: list[int], store: str) -> list[dict]:
    if torch.cuda.device_count() < world:
        why = f"needs {world} GPUs, {torch.cuda.device_count()} here"
        return [record("sharded_row_argmax", f"tp {world}", "sharded_row_argmax", None, error=why)]
    os.environ.update(NO_MULTICAST)
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(
        collective_rank, args=(world, store, rows, queue), nprocs=world, start_method="spawn"
    )
    return queue.get()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", default=ROWS)
    p.add_argument("--tp", default="2,4", help="one GPU: the shard widths' tensor parallelism")
    p.add_argument("--world", type=int, default=0, help="N GPUs: time the collective too")
    args = p.parse_args()
    rows = list(map(int, args.rows.split(",")))
    if args.world:
        store = f"/tmp/bench_sharded_row_argmax_{os.getpid()}"
        records = run_collective(args.world, rows, store)
        report(records, args.json, baseline="all-gather + row_argmax")
        return
    records = [r for tp in map(int, args.tp.split(",")) for n in rows for r in local_part(n, tp)]
    report(records, args.json, baseline=SGLANG_ARM)


if __name__ == "__main__":
    main()
