"""sharded_row_argmax and sharded_accept_greedy: torch.argmax of the concatenated shards, bitwise.

The ranks emulated in one process (every shard's keys, then the merge) and a one-rank gloo group
in this process, the kernels under the Triton interpreter (or on a GPU) and the torch fallback;
on the GPU tier the emulated shards eager and in a CUDA graph. Groups of spawned ranks:
test_sharded_groups.py.
"""

from __future__ import annotations

import random
import threading
import types

import numpy as np
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
from dsv41_kernels.ops.speculative.shard_scratch import ScratchPool
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


@pytest.mark.parametrize("path", [pytest.param("kernel", marks=needs_kernel), "fallback"])
def test_accept_from_keys_equals_the_rule(path):
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
        (dict(vocab_start=1.0), ValueError, "vocab_start must be an int"),
        (dict(vocab_start=True), ValueError, "vocab_start must be an int"),
        (dict(vocab_start=np.bool_(False)), ValueError, "vocab_start must be an int"),
        (dict(vocab_start=np.int64(-1)), ValueError, "vocab_start"),
        (dict(local_logits=torch.zeros(6, 8, dtype=torch.float8_e4m3fn)), ValueError, "float8"),
        # the keys compare fp32 values: float64 maxima closer than fp32 resolves would tie
        (dict(local_logits=torch.zeros(6, 8, dtype=torch.float64)), ValueError, "float64"),
        (dict(local_logits=torch.zeros(6, 8, device="meta")), ValueError, "meta"),
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


def test_sharded_accept_needs_candidates_on_the_logits_device(solo_group):
    candidates = torch.zeros(2, 3, dtype=torch.int64)
    args = {"local_logits": torch.randn(6, 8), "vocab_start": 0, "group": solo_group}
    with pytest.raises(ValueError, match="candidates must be on cpu"):
        sharded_accept_greedy(candidates.to("meta"), **args)
    assert not sharded_accept_greedy_admission(candidates.to("meta"), **args)
    cutoff = torch.ones(2, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="cutoff_verify_lens must be on cpu"):
        sharded_accept_greedy(candidates, cutoff_verify_lens=cutoff, **args)
    keys = torch.zeros(1, 6, dtype=torch.int64)
    with pytest.raises(ValueError, match="candidates must be on cpu"):
        accept_from_keys(candidates.to("meta"), keys)
    with pytest.raises(ValueError, match="gathered_keys is a meta tensor"):
        accept_from_keys(candidates.to("meta"), keys.to("meta"))
    with pytest.raises(ValueError, match="gathered_keys is a meta tensor"):
        merge_keys(keys.to("meta"))


CPU_KERNEL = pytest.mark.skipif(
    not triton_interpreter(), reason="the kernel path for CPU tensors: the Triton interpreter"
)


@pytest.mark.parametrize("path", [pytest.param("kernel", marks=CPU_KERNEL), "fallback"])
def test_numpy_ints_are_ints(request, solo_group, path):
    """vocab_start takes NumPy integers as every op's scalars do (bools are refused above)."""
    if path == "fallback":
        request.getfixturevalue("torch_fallback")
    gen = torch.Generator().manual_seed(21)
    x = planted_logits(2, (300,), gen)
    candidates, logits, cutoff = accept_case(2, 3, (300,), gen)
    for start in (np.int64(0), np.int32(0), np.uint8(0)):
        assert torch.equal(
            sharded_row_argmax(x, vocab_start=start, group=solo_group), torch.argmax(x, -1)
        )
        assert_accept_equal(
            sharded_accept_greedy(candidates, logits, vocab_start=start, group=solo_group),
            reference_accept(candidates, [logits]),
        )
        for vocab_start in (start, 0):
            verdicts = [
                sharded_row_argmax_admission(x, vocab_start=vocab_start, group=solo_group),
                sharded_accept_greedy_admission(
                    candidates, logits, vocab_start=vocab_start, group=solo_group
                ),
            ]
            assert [v.ok for v in verdicts] == [path == "kernel"] * 2, verdicts
    assert torch.equal(shard_keys(x, vocab_start=np.int64(7)), shard_keys(x, vocab_start=7))


@pytest.mark.parametrize("path", ["kernel", "fallback"])
@pytest.mark.parametrize("rows", [2, 0])
def test_no_column_on_any_rank_is_refused(request, solo_group, path, rows):
    """One rank holding no column: the vocabulary is empty and torch.argmax would raise, so
    both ops refuse it, naming local_logits, on every path."""
    if path == "fallback":
        request.getfixturevalue("torch_fallback")
    empty = torch.empty(rows * 3, 0)
    with pytest.raises(ValueError, match="local_logits has no column on any rank"):
        sharded_row_argmax(empty, vocab_start=0, group=solo_group)
    assert not sharded_row_argmax_admission(empty, vocab_start=0, group=solo_group)
    candidates = torch.zeros(rows, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="local_logits has no column on any rank"):
        sharded_accept_greedy(candidates, empty, vocab_start=0, group=solo_group)
    assert not sharded_accept_greedy_admission(candidates, empty, vocab_start=0, group=solo_group)


@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_admission_must_be_an_admission(request, solo_group, path):
    if path == "fallback":
        request.getfixturevalue("torch_fallback")
    x, candidates = torch.randn(6, 8), torch.zeros(2, 3, dtype=torch.int64)
    keys = torch.zeros(1, 6, dtype=torch.int64)
    calls = {
        "sharded_row_argmax": lambda a: sharded_row_argmax(
            x, vocab_start=0, group=solo_group, admission=a
        ),
        "sharded_accept_greedy": lambda a: sharded_accept_greedy(
            candidates, x, vocab_start=0, group=solo_group, admission=a
        ),
        "shard_keys": lambda a: shard_keys(x, vocab_start=0, admission=a),
        "merge_keys": lambda a: merge_keys(keys, admission=a),
        "accept_from_keys": lambda a: accept_from_keys(candidates, keys, admission=a),
    }
    for name, call in calls.items():
        for bad in ("kernel", True, 1):
            with pytest.raises(TypeError, match="admission"):
                call(bad)
                pytest.fail(f"{name} took admission={bad!r}")


@needs_kernel
def test_admission(solo_group):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.empty(6, 4096, device=device)
    assert sharded_row_argmax_admission(x, vocab_start=0, group=solo_group).kernel == "triton"
    rows = torch.empty(MAX_ROWS + 1, 8, device=device)
    verdict = sharded_row_argmax_admission(rows, vocab_start=0, group=solo_group)
    assert not verdict and "scratch" in verdict.reason
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


# ---- concurrency --------------------------------------------------------------------------------

THREADS, CALLS = 4, 6


def run_in_threads(call) -> list:
    """``call(thread, i)`` for ``CALLS`` calls in each of ``THREADS`` threads started together;
    every result, or the first exception raised."""
    start = threading.Barrier(THREADS)
    results: list = [None] * (THREADS * CALLS)
    errors: list = []

    def worker(thread: int) -> None:
        try:
            start.wait()
            for i in range(CALLS):
                results[thread * CALLS + i] = call(thread, i)
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            errors.append(e)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("width", [600, 4100])  # the shard's argmax: torch's, then the kernel's
def test_threads_at_once_get_their_own_rows(solo_group, width):
    """Four threads calling each op at once: every call its own rows (each call's scratch is
    its own, never another call's in flight)."""
    gen = torch.Generator().manual_seed(width)
    cases = [accept_case(2, 3, (width,), gen) for _ in range(THREADS * CALLS)]

    def case(thread: int, i: int):
        return cases[thread * CALLS + i]

    got = run_in_threads(
        lambda t, i: sharded_row_argmax(case(t, i)[1], vocab_start=0, group=solo_group)
    )
    wrong = [j for j, (_, x, _) in enumerate(cases) if not torch.equal(got[j], x.argmax(-1))]
    assert not wrong, f"{len(wrong)}/{len(cases)} argmax calls wrong"
    got = run_in_threads(lambda t, i: shard_keys(case(t, i)[1], vocab_start=5))
    for j, (_, logits, _) in enumerate(cases):
        assert torch.equal(got[j], shard_keys(logits, vocab_start=5, admission=TORCH_PATH))
    got = run_in_threads(
        lambda t, i: sharded_accept_greedy(
            case(t, i)[0], case(t, i)[1], vocab_start=0, group=solo_group,
            cutoff_verify_lens=case(t, i)[2],
        )
    )  # fmt: skip
    for j, (candidates, logits, cutoff) in enumerate(cases):
        assert_accept_equal(
            got[j], reference_accept(candidates, [logits], cutoff_verify_lens=cutoff)
        )


def test_scratch_pool_lends_each_call_its_own_set(monkeypatch):
    """Calls in flight hold distinct sets; a set given back is lent again (no growth in turn);
    a CUDA-graph capture takes a free set of another stream and makes none."""
    pool = ScratchPool("op", 4)
    cpu = torch.device("cpu")
    with pool.borrow(cpu, 2) as a, pool.borrow(cpu, 2) as b:
        assert a[0].data_ptr() != b[0].data_ptr() and a[2].shape == (8,)
    with pool.borrow(cpu, 2) as c:
        assert c[0].data_ptr() in (a[0].data_ptr(), b[0].data_ptr())
    stream = types.SimpleNamespace(cuda_stream=0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    gpu = torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match="before capturing"), pool.borrow(gpu, 2):
        pass
    warm = (torch.zeros(4), torch.zeros(4), torch.zeros(8))
    pool._free[(gpu, 1, 2)] = [warm]  # a set an eager call on another stream gave back
    with pool.borrow(gpu, 2) as captured:
        assert captured is warm
    with pool.borrow(gpu, 2) as again:  # it now stays with the capturing stream
        assert again is warm
    assert pool._free[(gpu, 1, 2)] == []


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
@pytest.mark.parametrize("streams", ["one stream", "a stream each"])
def test_gpu_threads_at_once_get_their_own_keys(streams):
    """Four threads of shard_keys at once, all on the current stream or each on its own: every
    call's keys its own (the shard's argmax and its keys in the call's own scratch)."""
    gen = torch.Generator().manual_seed(22)
    cases = [random_logits(6, 129280, gen).cuda() for _ in range(THREADS * CALLS)]
    expected = [shard_keys(x, vocab_start=3, admission=TORCH_PATH) for x in cases]
    shard_keys(cases[0], vocab_start=3)  # compiled before the threads start
    own = [torch.cuda.Stream() for _ in range(THREADS)]
    torch.cuda.synchronize()  # the logits are made before any stream reads them

    def call(thread: int, i: int):
        x = cases[thread * CALLS + i]
        if streams == "one stream":
            return shard_keys(x, vocab_start=3)
        with torch.cuda.stream(own[thread]):
            keys = shard_keys(x, vocab_start=3)
        torch.cuda.current_stream().wait_stream(own[thread])
        return keys

    got = run_in_threads(call)
    torch.cuda.synchronize()
    wrong = [j for j in range(len(cases)) if not torch.equal(got[j], expected[j])]
    assert not wrong, f"{len(wrong)}/{len(cases)} calls wrong"


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
