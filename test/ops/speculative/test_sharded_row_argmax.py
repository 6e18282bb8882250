"""sharded_row_argmax and sharded_accept_greedy: torch.argmax of the concatenated shards, bitwise.

The ranks emulated in one process (every shard's keys, then the merge) and a one-rank gloo group
in this process, the kernels under the Triton interpreter (or on a GPU) and the torch fallback;
on the GPU tier the emulated shards eager and in a CUDA graph. Groups of spawned ranks:
test_sharded_groups.py.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from dsv41_kernels import interpreter
from dsv41_kernels.admission import refuse, triton_interpreter
from dsv41_kernels.cases.sharded_row_argmax import (
    emulated_argmax,
    even_widths,
    gathered_keys,
    shards,
)
from dsv41_kernels.ops.speculative.argmax_reduction import MAX_ROWS
from dsv41_kernels.ops.speculative.sharded_accept_greedy import (
    accept_from_keys,
    sharded_accept_greedy,
    sharded_accept_greedy_admission,
)
from dsv41_kernels.ops.speculative.sharded_row_argmax import (
    admit_keys,
    merge_keys,
    order_key_torch,
    shard_keys,
    sharded_row_argmax,
    sharded_row_argmax_admission,
)
from dsv41_kernels.reference.sharded_row_argmax import sharded_accept_greedy as reference_accept
from dsv41_kernels.reference.sharded_row_argmax import sharded_row_argmax as reference_argmax
from test.machine import DEVICE, needs_kernel

from .logit_cases import NAN, random_logits
from .shard_cases import (
    accept_case,
    assert_accept_equal,
    cuts,
    planted_logits,
    random_widths,
)

TORCH_PATH = refuse("the torch statement, chosen by the test")


@pytest.fixture
def torch_fallback(monkeypatch):
    """The torch path of every op (the admissions refuse CPU tensors without the interpreter)."""
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)


# ---- the key order ---------------------------------------------------------------------------


def test_order_key_orders_like_argmax():
    """Increasing with the value; -0 == +0; every NaN (either sign) above +Inf, all equal."""
    big = torch.finfo(torch.float32).max
    tiny = torch.finfo(torch.float32).tiny
    values = [-float("inf"), -big, -1.0, -tiny, -1e-45, 0.0, 1e-45, tiny, 1.0, big, float("inf")]
    order = order_key_torch(torch.tensor(values)).tolist()
    assert order == sorted(order) and len(set(order)) == len(order)
    zeros = order_key_torch(torch.tensor([-0.0, 0.0]))
    assert zeros[0] == zeros[1]
    nans = torch.tensor([NAN, -NAN]).view(torch.int32)
    nans[1] |= 0x7FFF  # another payload
    assert order_key_torch(nans.view(torch.float32)).tolist() == [0x7FFFFFFF] * 2
    assert order[-1] < 0x7FFFFFFF


# ---- emulated ranks: every shard's keys in one process, then the merge --------------------------

WIDTHS = [
    (2501, 2502),  # even halves
    (1, 5002),  # a one-column first shard
    (5002, 1),  # a one-column last shard
    (4096, 907),  # the row_argmax kernel on the first shard, its fallback on the second
    (1000, 0, 2000, 2003),  # an empty shard in the middle
    (0, 5003),  # an empty first shard
    (1, 1, 1, 5000),
    (5003,),  # one rank
]


@needs_kernel
@pytest.mark.parametrize("widths", WIDTHS)
def test_emulated_shards_equal_torch_argmax(widths):
    gen = torch.Generator().manual_seed(sum(widths) + len(widths))
    x = planted_logits(6, widths, gen).to(DEVICE)
    assert admit_keys(x, x.shape[0])
    parts = [s for _, s in shards(x, widths)]
    assert torch.equal(emulated_argmax(x, widths), torch.argmax(x, dim=-1))
    assert torch.equal(emulated_argmax(x, widths).cpu(), reference_argmax(parts))


@pytest.mark.parametrize("widths", WIDTHS)
def test_fallback_equals_torch_argmax(torch_fallback, widths):
    gen = torch.Generator().manual_seed(len(widths))
    x = planted_logits(6, widths, gen)
    assert not admit_keys(x, x.shape[0])
    assert torch.equal(emulated_argmax(x, widths), torch.argmax(x, dim=-1))


@needs_kernel
def test_kernel_keys_equal_fallback_keys():
    """The Triton key and merge kernels and their torch statements give the same bits, half
    dtypes too."""
    gen = torch.Generator().manual_seed(7)
    widths = (2048, 2955)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = planted_logits(4, widths, gen).to(DEVICE, dtype)
        ours = gathered_keys(x, widths)
        torch_keys = torch.stack(
            [
                shard_keys(s, vocab_start=start, admission=TORCH_PATH)
                for start, s in shards(x, widths)
            ]
        )
        assert torch.equal(ours, torch_keys)
        assert torch.equal(merge_keys(ours), merge_keys(ours, admission=TORCH_PATH))
        assert torch.equal(merge_keys(ours), torch.argmax(x, dim=-1))


def test_hundreds_of_random_splits(torch_fallback):
    """300 random uneven splits (empty shards included) of random rows with planted values."""
    rng = random.Random(19)
    gen = torch.Generator().manual_seed(19)
    for _ in range(300):
        vocab = rng.randint(2, 600)
        widths = random_widths(vocab, rng.randint(1, 6), rng)
        x = random_logits(rng.randint(1, 8), vocab, gen)
        boundary = cuts(widths)
        if boundary:
            x[:, rng.choice(boundary)] = rng.choice([NAN, float("inf"), x.max().item(), 0.0])
        assert torch.equal(emulated_argmax(x, widths), torch.argmax(x, dim=-1)), widths


@needs_kernel
def test_random_splits_under_the_kernels():
    rng = random.Random(20)
    gen = torch.Generator().manual_seed(20)
    for _ in range(12):
        vocab = rng.randint(4096, 9000)
        widths = random_widths(vocab, rng.randint(2, 4), rng)
        x = planted_logits(rng.randint(1, 6), widths, gen).to(DEVICE)
        assert torch.equal(emulated_argmax(x, widths), torch.argmax(x, dim=-1)), widths


@needs_kernel
def test_strided_shards():
    """Shards are column slices of the full rows (row stride = the full width), or rows of a
    wider buffer; strides are read, never assumed."""
    gen = torch.Generator().manual_seed(8)
    wide = planted_logits(6, (3000, 3001), gen).to(DEVICE)
    view = wide[::2]
    assert view.stride(0) == 2 * 6001
    assert torch.equal(emulated_argmax(view, (3000, 3001)), torch.argmax(view, dim=-1))
    cols = torch.randn(5003, 10, generator=gen).t().to(DEVICE)  # column stride 10
    assert torch.equal(emulated_argmax(cols, (2000, 3003)), torch.argmax(cols, dim=-1))


# ---- the accept form, emulated -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_accept_from_keys_equals_the_rule(path):
    if path == "kernel" and not (torch.cuda.is_available() or triton_interpreter()):
        pytest.skip("no Triton device")
    admission = TORCH_PATH if path == "fallback" else None
    gen = torch.Generator().manual_seed(11)
    rng = random.Random(11)
    for bs, n in ((1, 6), (3, 2), (5, 1), (4, 7), (2, 16)):
        widths = random_widths(rng.randint(8, 900), rng.randint(1, 4), rng)
        candidates, logits, cutoff = accept_case(bs, n, widths, gen)
        parts = [s for _, s in shards(logits, widths)]
        keys = gathered_keys(logits.to(DEVICE), widths)
        # Verify lengths outside SGLang's 1..n as the one-GPU accept reads them (int64 ones
        # beyond int32 too): VERIFY_LENS_RULE.
        outside = torch.tensor([2**40, n + 1, 0, 1 - n, -n - 3, -(2**40)], dtype=torch.int64)
        wild = outside[torch.randint(0, len(outside), (bs,), generator=gen)]
        for cand, cut in (
            (candidates, None),
            (candidates, cutoff),
            (candidates.int(), cutoff.long()),
            (candidates, wild),
        ):
            ours = accept_from_keys(
                cand.to(DEVICE),
                keys,
                cutoff_verify_lens=None if cut is None else cut.to(DEVICE),
                admission=admission,
            )
            assert_accept_equal(ours, reference_accept(candidates, parts, cutoff_verify_lens=cut))


# ---- admission and bad input --------------------------------------------------------------------


@pytest.fixture
def solo_group(tmp_path):
    """A gloo group of one rank, this process: a real ProcessGroup for the admissions."""
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    store = tmp_path / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(local_logits=torch.empty(6)), ValueError, "local_logits must be 2-D"),
        (dict(local_logits=torch.empty(6, 8, dtype=torch.int32)), ValueError, "local_logits"),
        (dict(local_logits="logits"), ValueError, "local_logits must be a torch.Tensor"),
        (dict(vocab_start=-1), ValueError, "vocab_start"),
        (dict(vocab_start=2**32 - 7), ValueError, "vocab_start"),
        (dict(vocab_start=1.0), TypeError, "vocab_start must be an int"),
        (dict(vocab_start=True), TypeError, "vocab_start must be an int"),
        (dict(group=None), TypeError, "group must be a torch.distributed.ProcessGroup"),
        (dict(out=torch.empty(5, dtype=torch.int64)), ValueError, "out must be"),
        (dict(out=torch.empty(6, dtype=torch.int32)), ValueError, "out must have dtype"),
    ],
)
def test_bad_input_names_the_argument(solo_group, kwargs, error, match):
    args = {"local_logits": torch.randn(6, 8), "vocab_start": 0, "group": solo_group, **kwargs}
    with pytest.raises(error, match=match):
        sharded_row_argmax(**args)
    verdict = sharded_row_argmax_admission(**args)  # refuses, never raises
    assert not verdict and match in verdict.reason


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(candidates=torch.zeros(2, 4, dtype=torch.int64)), "bs \\* n = 2 \\* 4"),
        (dict(candidates=torch.zeros(6, 0, dtype=torch.int64)), "candidates has empty rows"),
        (dict(candidates=torch.zeros(2, 3)), "candidates must have dtype"),
        (dict(cutoff_verify_lens=torch.ones(3, dtype=torch.int32)), "cutoff_verify_lens"),
        (dict(out=(torch.empty(2, dtype=torch.int32),)), "out must be"),
        (dict(out=tuple(torch.empty(2, dtype=torch.int64) for _ in range(3))), "correct_len"),
    ],
)
def test_accept_bad_input_names_the_argument(solo_group, kwargs, match):
    args = {
        "candidates": torch.zeros(2, 3, dtype=torch.int64),
        "local_logits": torch.randn(6, 8),
        "vocab_start": 0,
        "group": solo_group,
        **kwargs,
    }
    with pytest.raises(ValueError, match=match):
        sharded_accept_greedy(**args)
    assert not sharded_accept_greedy_admission(**args)


@needs_kernel
def test_admission(solo_group):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.empty(6, 4096, device=device)
    assert sharded_row_argmax_admission(x, vocab_start=0, group=solo_group).kernel == "triton"
    rows = torch.empty(MAX_ROWS + 1, 8, device=device)
    verdict = sharded_row_argmax_admission(rows, vocab_start=0, group=solo_group)
    assert not verdict and "workspace" in verdict.reason
    candidates = torch.zeros(1, 65, dtype=torch.int64, device=device)
    verdict = sharded_accept_greedy_admission(
        candidates, torch.empty(65, 8, device=device), vocab_start=0, group=solo_group
    )
    assert not verdict and "65 verify rows" in verdict.reason


def test_one_rank_group(solo_group):
    """World 1: the gather is the identity, the op is torch.argmax; zero rows too."""
    gen = torch.Generator().manual_seed(12)
    x = planted_logits(4, (600,), gen)
    out = torch.empty(x.shape[0], dtype=torch.int64)
    assert sharded_row_argmax(x, vocab_start=0, group=solo_group, out=out) is out
    assert torch.equal(out, torch.argmax(x, dim=-1))
    assert sharded_row_argmax(x[:0], vocab_start=0, group=solo_group).shape == (0,)
    candidates, logits, cutoff = accept_case(3, 4, (600,), gen)
    assert_accept_equal(
        sharded_accept_greedy(candidates, logits, vocab_start=0, group=solo_group),
        reference_accept(candidates, [logits]),
    )
    empty = sharded_accept_greedy(
        candidates[:0], logits[:0], vocab_start=0, group=solo_group, cutoff_verify_lens=cutoff[:0]
    )
    assert [t.shape for t in empty] == [(0,)] * 3


# ---- GPU tier ----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_emulated_shards():
    """DSpark's verify rows at TP 2 and 4 and in random uneven shards (2 to 8), each shard's
    keys on the GPU; the special and boundary rows in fp32 and bf16; 1, 64 and 384 rows."""
    gen = torch.Generator().manual_seed(13)
    rng = random.Random(13)
    splits = [even_widths(129280, 2), even_widths(129280, 4)]
    bad = 0
    for case in range(60):
        widths = splits[case % 2] if case % 3 else random_widths(129280, rng.randint(2, 8), rng)
        x = random_logits(6, 129280, gen).cuda()
        bad += int((emulated_argmax(x, widths) != torch.argmax(x, dim=-1)).sum())
    assert bad == 0
    batches = [random_logits(rows, 129280, gen).cuda() for rows in (1, 64, 384)]
    for widths in splits + [(32320 + 7, 32320 - 7, 1, 64639)]:
        for dtype in (torch.float32, torch.bfloat16):
            x = planted_logits(6, widths, gen).to("cuda", dtype)
            assert torch.equal(emulated_argmax(x, widths), torch.argmax(x, dim=-1)), widths
        for x in batches:
            assert torch.equal(emulated_argmax(x, widths), torch.argmax(x, dim=-1))


@pytest.mark.gpu
def test_gpu_emulated_accept():
    gen = torch.Generator().manual_seed(14)
    for bs in (1, 8, 64):
        widths = even_widths(129280, 4)
        candidates, logits, cutoff = accept_case(bs, 6, widths, gen)
        keys = gathered_keys(logits.cuda(), widths)
        for cut in (None, cutoff):
            ours = accept_from_keys(
                candidates.cuda(), keys, cutoff_verify_lens=None if cut is None else cut.cuda()
            )
            assert_accept_equal(
                ours, reference_accept(candidates, [logits], cutoff_verify_lens=cut)
            )


@pytest.mark.gpu
def test_gpu_emulated_cuda_graph_replay():
    """Every shard's keys into its row of the gathered buffer, then the merge, captured once
    and replayed with new logits: nothing allocated, no host sync."""
    gen = torch.Generator().manual_seed(15)
    widths = even_widths(129280, 4)
    x = random_logits(6, 129280, gen).cuda()
    keys = torch.empty(len(widths), 6, dtype=torch.int64, device="cuda")
    out = torch.empty(6, dtype=torch.int64, device="cuda")

    def step():
        for rank, (start, shard) in enumerate(shards(x, widths)):
            shard_keys(shard, vocab_start=start, out=keys[rank])
        merge_keys(keys, out=out)

    step()  # workspaces made outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    planted = planted_logits(0, widths, gen)
    for replay in range(20):
        fresh = random_logits(6, 129280, gen) if replay % 2 else planted[replay : replay + 6]
        x.copy_(fresh)
        graph.replay()
        assert torch.equal(out, torch.argmax(x, dim=-1))
