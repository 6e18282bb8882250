"""sharded_row_argmax and sharded_accept_greedy in real process groups: gloo groups of 2 and 4
spawned CPU ranks (the kernels under the Triton interpreter, then the torch fallback), and NCCL
groups of 1, 2 and 4 GPUs, eager and in a CUDA graph (those of 2 and 4 skip without the GPUs).
"""

from __future__ import annotations

import os
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dsv41_kernels import interpreter
from dsv41_kernels.admission import triton_interpreter
from dsv41_kernels.cases.sharded_row_argmax import even_widths, shards
from dsv41_kernels.ops.speculative.sharded_accept_greedy import sharded_accept_greedy
from dsv41_kernels.ops.speculative.sharded_row_argmax import sharded_row_argmax
from dsv41_kernels.reference.sharded_row_argmax import sharded_accept_greedy as reference_accept

from .shard_cases import accept_case, assert_accept_equal, planted_logits, random_widths

# NVLink multicast stays off, in this process and in every rank spawned from it.
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


# ---- real groups: spawned ranks -----------------------------------------------------------------


# Uneven shards where some ranks take the row_argmax kernel (>= 4096 columns) and some not.
KERNEL_WIDTHS = {1: (4100,), 2: (4097, 13), 4: (4096, 7, 4099, 1)}


def rank_cases(world: int, device) -> list[tuple[int, tuple[int, ...], int]]:
    """``(rows, widths, seed)`` every rank runs, the same on all: even and uneven shards, an
    empty one, shards at the row_argmax kernel's width and below it."""
    rng = random.Random(world)
    cases = [(6, even_widths(129280 if device.type == "cuda" else 8192, world), 0)]
    cases += [(4, KERNEL_WIDTHS[world], 1)]
    if world > 1:
        cases += [(3, (0, *even_widths(700, world - 1)), 2)]
    cases += [
        (rng.randint(1, 12), random_widths(rng.randint(64, 900), world, rng), s)
        for s in range(3, 6)
    ]
    if device.type == "cuda":
        cases += [(rows, even_widths(129280, world), rows) for rows in (1, 64, 384)]
        cases += [(6, random_widths(129280, world, rng), 100 + s) for s in range(40)]
    return cases


def check_rank(rank: int, world: int, group, device) -> None:
    """This rank's shard of every case: the op equals torch.argmax of the full rows, and the
    accept equals the rule over them, on every rank."""
    for rows, widths, seed in rank_cases(world, device):
        gen = torch.Generator().manual_seed(seed)
        full = planted_logits(rows, widths, gen)
        start, mine = shards(full, widths)[rank]
        mine = mine.to(device)
        out = torch.full((full.shape[0],), -1, dtype=torch.int64, device=device)
        got = sharded_row_argmax(mine, vocab_start=start, group=group, out=out)
        assert torch.equal(got.cpu(), torch.argmax(full, dim=-1)), (rank, widths)
        bs, n = 2, 3
        candidates, logits, cutoff = accept_case(bs, n, widths, gen)
        start, mine = shards(logits, widths)[rank]
        ours = sharded_accept_greedy(
            candidates.to(device),
            mine.to(device),
            vocab_start=start,
            group=group,
            cutoff_verify_lens=cutoff.to(device),
        )
        assert_accept_equal(ours, reference_accept(candidates, [logits], cutoff_verify_lens=cutoff))


def gloo_rank(rank: int, store: str) -> None:
    """Rank ``rank`` of 4 CPU processes: the checks in a group of the first 2, then of all 4."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=4)
    try:
        groups = {
            world: dist.new_group(list(range(world))) for world in (2, 4)
        }  # TP-like subgroups
        # The kernels under the interpreter, then the torch fallback.
        for interpret in (interpreter.RUNS_IN_INTERPRETER, False):
            interpreter.RUNS_IN_INTERPRETER = interpret
            for world, group in groups.items():
                if rank < world:
                    check_rank(rank, world, group, torch.device("cpu"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not triton_interpreter(), reason="CPU tier: the Triton interpreter")
def test_gloo_groups_of_2_and_4(tmp_path):
    # Forked from a server that imported this module once, rather than four processes each
    # importing torch (this process cannot fork them itself: its OpenMP pool is not fork-safe).
    mp.set_forkserver_preload([__name__])
    store = str(tmp_path / "store")
    mp.start_processes(gloo_rank, args=(store,), nprocs=4, start_method="forkserver")


def nccl_rank(rank: int, world: int, store: str) -> None:
    os.environ.update(NO_MULTICAST)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        device = torch.device("cuda", rank)
        group = dist.new_group(list(range(world)))
        check_rank(rank, world, group, device)
        check_rank_in_cuda_graph(rank, world, group, device)
    finally:
        dist.destroy_process_group()


def check_rank_in_cuda_graph(rank: int, world: int, group, device) -> None:
    """The op and its accept captured once with NCCL inside, replayed with new shards."""
    widths = even_widths(129280, world)
    bs, n = 4, 6
    gen = torch.Generator().manual_seed(16)
    candidates, logits, cutoff = accept_case(bs, n, widths, gen)
    start, mine = shards(logits, widths)[rank]
    shard = mine.to(device)  # contiguous static input, refilled before every replay
    cand, cut = candidates.to(device), cutoff.to(device)
    index = torch.empty(bs * n, dtype=torch.int64, device=device)
    accept = tuple(
        torch.empty(bs, dtype=d, device=device) for d in (torch.int32, torch.int64, torch.int32)
    )

    def step():
        sharded_row_argmax(shard, vocab_start=start, group=group, out=index)
        sharded_accept_greedy(
            cand, shard, vocab_start=start, group=group, cutoff_verify_lens=cut, out=accept
        )

    step()  # eager first: workspaces and the NCCL communicator exist before capture
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(10):
        candidates, logits, cutoff = accept_case(bs, n, widths, gen)
        shard.copy_(shards(logits, widths)[rank][1])
        cand.copy_(candidates)
        cut.copy_(cutoff)
        graph.replay()
        assert torch.equal(index.cpu(), torch.argmax(logits, dim=-1))
        assert_accept_equal(
            accept, reference_accept(candidates, [logits], cutoff_verify_lens=cutoff)
        )


def _gpus(world: int):
    return pytest.param(
        world,
        marks=pytest.mark.skipif(
            torch.cuda.device_count() < world,
            reason=f"needs {world} GPUs, {torch.cuda.device_count()} here",
        ),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("world", [_gpus(1), _gpus(2), _gpus(4)])
def test_gpu_nccl_group(tmp_path, monkeypatch, world):
    for name, value in NO_MULTICAST.items():
        monkeypatch.setenv(name, value)
    mp.spawn(nccl_rank, args=(world, str(tmp_path / "store")), nprocs=world)
