import pytest
import torch

from dsv41_kernels import interpreter
from dsv41_kernels.devices import sm_major
from dsv41_kernels.jit import module_available
from dsv41_kernels.ops.speculative.accept_greedy import (
    accept_greedy,
    accept_greedy_admission,
    accept_greedy_torch,
    launch_triton,
)
from dsv41_kernels.ops.speculative.argmax_plan import triton_launch
from dsv41_kernels.reference.accept_greedy import accept_greedy as accept_rule
from test.machine import DEVICE, needs_kernel

from .logit_cases import random_logits, special_rows


def make_case(bs, n, vocab, gen, *, dtype=torch.int64):
    """Candidates that agree with the target's argmax for a random prefix, then diverge."""
    logits = random_logits(bs * n, vocab, gen)
    predict = torch.argmax(logits, dim=-1).view(bs, n)
    candidates = torch.randint(0, vocab, (bs, n), generator=gen)
    for b in range(bs):
        keep = int(torch.randint(0, n, (1,), generator=gen))
        candidates[b, 1 : keep + 1] = predict[b, :keep]
    cutoff = torch.randint(1, n + 2, (bs,), generator=gen, dtype=torch.int32)
    return candidates.to(dtype), logits, cutoff


def assert_same(ours, ref):
    for o, r, dtype in zip(ours, ref, (torch.int32, torch.int64, torch.int32)):
        assert o.dtype == dtype and torch.equal(o.cpu(), r.cpu()), (ours, ref)


def test_rule_by_hand():
    """The plain statement on a hand-made case: 2 accepted, bonus at index 2, then the cap."""
    vocab, n = 8, 4
    predict = [[3, 5, 1, 7]]
    logits = torch.full((n, vocab), -1.0)
    for k, tok in enumerate(predict[0]):
        logits[k, tok] = 1.0
    candidates = torch.tensor(
        [[9, 3, 5, 2]]
    )  # cand[1]==pred[0], cand[2]==pred[1], cand[3]!=pred[2]
    correct, bonus, trim = accept_rule(candidates, logits)
    assert (correct.item(), bonus.item(), trim.item()) == (2, 1, 0)
    correct, bonus, trim = accept_rule(candidates, logits, cutoff_verify_lens=torch.tensor([2]))
    assert (correct.item(), bonus.item(), trim.item()) == (1, 5, 1)


@pytest.mark.parametrize("cut", [False, True])
def test_torch_composition_matches_rule(cut):
    gen = torch.Generator().manual_seed(10)
    for bs, n in ((1, 6), (3, 2), (5, 1), (4, 7)):
        candidates, logits, cutoff = make_case(bs, n, 64, gen)
        c = cutoff if cut else None
        assert_same(
            accept_greedy_torch(candidates, logits, c),
            accept_rule(candidates, logits, cutoff_verify_lens=c),
        )


@needs_kernel
@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("cand_dtype", [torch.int32, torch.int64])
def test_kernel_matches_rule(cut, cand_dtype):
    gen = torch.Generator().manual_seed(11)
    for bs, n in ((1, 6), (2, 3), (3, 1), (1, 8)):
        candidates, logits, cutoff = make_case(bs, n, 4099, gen, dtype=cand_dtype)
        c = cutoff.to(DEVICE) if cut else None
        args = (candidates.to(DEVICE), logits.to(DEVICE))
        assert accept_greedy_admission(*args, c)
        ours = accept_greedy(*args, cutoff_verify_lens=c)
        assert_same(
            ours, accept_rule(candidates, logits, cutoff_verify_lens=cutoff if cut else None)
        )


@needs_kernel
def test_cutoff_of_zero_wraps_like_python_indexing():
    gen = torch.Generator().manual_seed(12)
    candidates, logits, _ = make_case(2, 4, 4096, gen)
    cutoff = torch.tensor([0, 1], dtype=torch.int32)
    ref = accept_rule(candidates, logits, cutoff_verify_lens=cutoff)
    ours = accept_greedy(
        candidates.to(DEVICE), logits.to(DEVICE), cutoff_verify_lens=cutoff.to(DEVICE)
    )
    assert_same(ours, ref)


@needs_kernel
def test_preallocated_out():
    gen = torch.Generator().manual_seed(13)
    candidates, logits, cutoff = make_case(2, 6, 4096, gen)
    out = (
        torch.full((2,), -5, dtype=torch.int32, device=DEVICE),
        torch.full((2,), -5, dtype=torch.int64, device=DEVICE),
        torch.full((2,), -5, dtype=torch.int32, device=DEVICE),
    )
    got = accept_greedy(candidates.to(DEVICE), logits.to(DEVICE), out=out)
    assert all(g is o for g, o in zip(got, out))
    assert_same(out, accept_rule(candidates, logits))


def test_fallback_when_refused(monkeypatch):
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    gen = torch.Generator().manual_seed(14)
    candidates, logits, cutoff = make_case(3, 6, 4096, gen)
    assert not accept_greedy_admission(candidates, logits)
    assert_same(
        accept_greedy(candidates, logits, cutoff_verify_lens=cutoff),
        accept_rule(candidates, logits, cutoff_verify_lens=cutoff),
    )


LOGITS = torch.randn(6, 4096)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (
            dict(candidates=torch.zeros(2, 3, dtype=torch.int64), logits=torch.randn(5, 8)),
            "bs \\* n",
        ),
        (
            dict(candidates=torch.zeros(2, 3, dtype=torch.float32), logits=torch.randn(6, 8)),
            "candidates",
        ),
        (
            dict(candidates=torch.zeros(6, dtype=torch.int64), logits=torch.randn(6, 8)),
            "candidates",
        ),
        (dict(candidates=torch.zeros(2, 3, dtype=torch.int64), logits=torch.randn(6, 0)), "empty"),
        (
            dict(
                candidates=torch.zeros(2, 3, dtype=torch.int64),
                logits=torch.zeros(6, 8, dtype=torch.int32),
            ),
            "logits",
        ),
        (
            dict(
                candidates=torch.zeros(2, 3, dtype=torch.int64),
                logits=torch.randn(6, 8),
                cutoff_verify_lens=torch.ones(3, dtype=torch.int32),
            ),
            "cutoff_verify_lens",
        ),
        (
            dict(
                candidates=torch.zeros(2, 3, dtype=torch.int64),
                logits=torch.randn(6, 8),
                out=(torch.empty(2, dtype=torch.int64),) * 3,
            ),
            "out\\[0\\]",
        ),
        (
            dict(
                candidates=torch.zeros(2, 3, dtype=torch.int64),
                logits=torch.zeros(6, 8, dtype=torch.float8_e4m3fn),
            ),
            "logits must be floating point of a dtype torch.argmax takes",
        ),
        (
            dict(candidates=torch.zeros(2, 3, dtype=torch.int64, device="meta"), logits=LOGITS),
            "candidates must be on cpu",
        ),
        (
            dict(
                candidates=torch.zeros(2, 3, dtype=torch.int64),
                logits=LOGITS,
                cutoff_verify_lens=torch.ones(2, dtype=torch.int32, device="meta"),
            ),
            "cutoff_verify_lens must be on cpu",
        ),
        (
            dict(
                candidates=torch.zeros(2, 3, dtype=torch.int64, device="meta"),
                logits=LOGITS.to("meta"),
            ),
            "logits is a meta tensor",
        ),
    ],
)
@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_bad_input(monkeypatch, kwargs, match, path):
    if path == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    kwargs = dict(kwargs)
    candidates, logits = kwargs.pop("candidates"), kwargs.pop("logits")
    with pytest.raises(ValueError, match=match):
        accept_greedy(candidates, logits, **kwargs)
    cutoff = kwargs.pop("cutoff_verify_lens", None)
    verdict = accept_greedy_admission(candidates, logits, cutoff, **kwargs)  # refuses, no raise
    assert not verdict and verdict.reason.startswith("invalid arguments")


@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_admission_must_be_an_admission(monkeypatch, path):
    if path == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    candidates = torch.zeros(2, 3, dtype=torch.int64)
    for bad in ("kernel", True, 1):
        with pytest.raises(TypeError, match="admission"):
            accept_greedy(candidates, torch.randn(6, 8), admission=bad)


# ---- GPU tier ------------------------------------------------------------------------------


def on_cuda_kernel(admission) -> bool:
    """Whether the admission's plan runs one of the CUDA kernels."""
    return admission.ok and admission.plan.cuda is not None


def triton_accept(candidates, logits, cutoff, out):
    launch_triton(candidates, logits, cutoff, out, triton_launch(*logits.shape))


@pytest.mark.gpu
def test_gpu_fused_equals_unfused_composition():
    """bs 1, 2, 4 and 8 at n 6, with and without a cutoff, 6 times each."""
    gen = torch.Generator().manual_seed(15)
    for i in range(48):
        bs = (1, 2, 4, 8)[i % 4]
        candidates, logits, cutoff = make_case(bs, 6, 129280, gen)
        candidates, logits, cutoff = candidates.cuda(), logits.cuda(), cutoff.cuda()
        c = cutoff if i % 2 else None
        assert accept_greedy_admission(candidates, logits, c)
        assert_same(
            accept_greedy(candidates, logits, cutoff_verify_lens=c),
            accept_greedy_torch(candidates, logits, c),
        )


@pytest.mark.gpu
def test_gpu_graph_capture_and_replay():
    gen = torch.Generator().manual_seed(16)
    candidates, logits, cutoff = (t.cuda() for t in make_case(1, 6, 129280, gen))
    out = (
        torch.empty(1, dtype=torch.int32, device="cuda"),
        torch.empty(1, dtype=torch.int64, device="cuda"),
        torch.empty(1, dtype=torch.int32, device="cuda"),
    )
    accept_greedy(candidates, logits, cutoff_verify_lens=cutoff, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        accept_greedy(candidates, logits, cutoff_verify_lens=cutoff, out=out)
    for _ in range(30):
        c, lg, cut = make_case(1, 6, 129280, gen)
        candidates.copy_(c)
        logits.copy_(lg)
        cutoff.copy_(cut)
        graph.replay()
        assert_same(out, accept_rule(c, lg, cutoff_verify_lens=cut))


@pytest.mark.gpu
def test_gpu_cluster_accept_equals_triton_accept():
    """Both one-launch kernels against the torch composition: n from 1 to 8, up to 8 rows,
    int32/int64 candidates, cutoffs from 0 (wraps) to n + 1, NaN/Inf/ties from random_logits,
    and shapes alternating call to call, so a ticket left armed would show: every combination
    of the pattern below (its period is 24) twice."""
    gen = torch.Generator().manual_seed(17)
    cuda_calls = 0
    for i in range(48):
        n = 1 + i % 8
        bs = 1 if i % 3 else max(1, 8 // n)
        vocab = (129280, 4099, 32000)[i % 3]
        candidates, logits, cutoff = make_case(
            bs, n, vocab, gen, dtype=(torch.int32, torch.int64)[i % 2]
        )
        cutoff = torch.randint(0, n + 2, (bs,), generator=gen, dtype=torch.int32)
        candidates, logits, cutoff = candidates.cuda(), logits.cuda(), cutoff.cuda()
        c = cutoff if i % 4 < 2 else None
        ref = accept_greedy_torch(candidates, logits, c)
        cuda_calls += on_cuda_kernel(accept_greedy_admission(candidates, logits, c))
        assert_same(accept_greedy(candidates, logits, cutoff_verify_lens=c), ref)
        triton_out = tuple(torch.empty_like(t) for t in ref)
        triton_accept(candidates, logits, c, triton_out)
        assert_same(triton_out, ref)
    # rows of 4099 fp32 are not 16-byte aligned: those take the Triton kernel everywhere
    assert cuda_calls == 32 or not (sm_major(0) >= 9 and module_available("row_argmax", 0))


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and sm_major(0) >= 9 and module_available("row_argmax", 0)),
    reason="the CUDA cluster accept needs sm_90+ and its module (prebuilt, or a toolchain)",
)
def test_gpu_cluster_accept_across_the_generation_wrap():
    """The tickets' 31-bit generation wraps to 0; slots of the previous generation (and the -1
    of rows a launch did not use) are never read as current, on either side of the wrap."""
    from dsv41_kernels.ops.speculative.accept_greedy import CLUSTER_WORKSPACE

    gen = torch.Generator().manual_seed(18)
    candidates, logits, cutoff = make_case(1, 6, 129280, gen)
    accept_greedy(candidates.cuda(), logits.cuda())  # the workspace exists
    slots, tickets = CLUSTER_WORKSPACE.get(logits.cuda().device)
    tickets[0] = (2**31 - 2) << 32
    for i in range(8):
        n = (6, 3, 8, 1)[i % 4]
        candidates, logits, cutoff = (t.cuda() for t in make_case(1, n, 129280, gen))
        assert on_cuda_kernel(accept_greedy_admission(candidates, logits, cutoff))
        ref = accept_greedy_torch(candidates, logits, cutoff)
        assert_same(accept_greedy(candidates, logits, cutoff_verify_lens=cutoff), ref)
    assert int(tickets[0]) >> 32 == 6  # 2**31 - 2 + 8 launches, modulo 2**31


CUDA_ACCEPT = pytest.mark.skipif(
    not (torch.cuda.is_available() and sm_major(0) >= 9 and module_available("row_argmax", 0)),
    reason="the CUDA accept needs sm_90+ and its module (prebuilt, or a toolchain)",
)


def cuda_case(bs, n, vocab, dtype, gen):
    """A make_case on the GPU with the special rows spread over the batch, as ``dtype`` in rows
    of a wider buffer (16-byte aligned starts, a partial last vector at odd vocabularies)."""
    candidates, logits, cutoff = make_case(
        bs, n, vocab, gen, dtype=(torch.int32, torch.int64)[n % 2]
    )
    specials = torch.stack(special_rows(vocab))[: bs * n]
    logits[torch.randperm(bs * n, generator=gen)[: specials.shape[0]]] = specials
    wide = torch.zeros(bs * n, (vocab + 15) // 8 * 8, dtype=dtype, device="cuda")
    wide[:, :vocab].copy_(logits)
    cutoff = torch.randint(0, n + 2, (bs,), generator=gen, dtype=torch.int32)
    return candidates.cuda(), wide[:, :vocab], cutoff.cuda()


@pytest.mark.gpu
@CUDA_ACCEPT
def test_gpu_cuda_accept_past_8_rows():
    """Past 8 rows the accept takes the argmax's CUDA kernels too: clusters below 96 rows, one
    CTA a row from 96 while the rows fit the GPU at once (264 on the H200), clusters beyond; up
    to bs 64 x n 6 = 384 rows and n up to 16, fp32 and bf16, int32/int64 candidates, cutoffs
    from 0 (wraps) to n + 1, against the torch composition. Shapes alternate call to call, so
    a ticket left armed would show; then one CUDA graph at bs 64 replayed with new logits."""
    gen = torch.Generator().manual_seed(21)
    shapes = [(16, 6), (64, 6), (2, 16), (17, 6), (96, 1), (24, 16), (44, 6), (33, 8), (128, 2)]
    shapes += [(264, 1), (384, 1), (5, 16), (48, 6), (130, 2), (11, 9), (64, 6), (16, 6)]
    for i, (bs, n) in enumerate(shapes):
        vocab = (129280, 129283, 151936)[i % 3]
        dtype = (torch.float32, torch.bfloat16)[i % 4 == 3]
        candidates, logits, cutoff = cuda_case(bs, n, vocab, dtype, gen)
        c = cutoff if i % 2 else None
        assert on_cuda_kernel(accept_greedy_admission(candidates, logits, c)), (bs, n)
        assert_same(
            accept_greedy(candidates, logits, cutoff_verify_lens=c),
            accept_greedy_torch(candidates, logits, c),
        )
    candidates, logits, cutoff = cuda_case(64, 6, 129280, torch.float32, gen)
    out = tuple(
        torch.empty(64, dtype=dtype, device="cuda")
        for dtype in (torch.int32, torch.int64, torch.int32)
    )
    accept_greedy(candidates, logits, cutoff_verify_lens=cutoff, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        accept_greedy(candidates, logits, cutoff_verify_lens=cutoff, out=out)
    for _ in range(4):
        fresh = cuda_case(64, 6, 129280, torch.float32, gen)
        for dst, src in zip((candidates, logits, cutoff), fresh):
            dst.copy_(src)
        graph.replay()
        assert_same(out, accept_greedy_torch(candidates, logits, cutoff))


# ---- verify lengths outside SGLang's 1..n -----------------------------------------------------

OUTSIDE_VERIFY_LENS = [-(2**63), -(2**31) - 1, -(2**31), -13, -6, -5, -1, 0, 1, 6, 7]
OUTSIDE_VERIFY_LENS += [2**31 - 1, 2**31, 2**32 + 1, 2**63 - 1]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_every_verify_length_has_one_answer_on_every_path(dtype):
    """Values are never checked (that would sync), so each has an exact result, the same on the
    kernel and the fallback: 2**32 + 1 does not wrap to 1, and -13 gives no index error."""
    values = [
        v for v in OUTSIDE_VERIFY_LENS if torch.iinfo(dtype).min <= v <= torch.iinfo(dtype).max
    ]
    gen = torch.Generator().manual_seed(19)
    candidates, logits, _ = make_case(len(values), 6, 4096, gen)
    cutoff = torch.tensor(values, dtype=dtype)
    ref = accept_rule(candidates, logits, cutoff_verify_lens=cutoff)
    uncapped = accept_rule(candidates, logits)
    for b, v in enumerate(values):
        if v >= 6:  # a length past n never caps
            assert int(ref[0][b]) == int(uncapped[0][b]) and int(ref[2][b]) == 0
    assert_same(accept_greedy_torch(candidates, logits, cutoff), ref)
    if accept_greedy_admission(candidates, logits, cutoff):  # the Triton kernel (interpreter)
        assert_same(accept_greedy(candidates, logits, cutoff_verify_lens=cutoff), ref)


@pytest.mark.gpu
def test_gpu_every_verify_length_has_one_answer_on_every_kernel():
    """The CUDA cluster accept and the Triton kernel read the same lengths the same way."""
    gen = torch.Generator().manual_seed(20)
    for dtype in (torch.int64, torch.int32):
        info = torch.iinfo(dtype)
        for v in (v for v in OUTSIDE_VERIFY_LENS if info.min <= v <= info.max):
            candidates, logits, _ = (t.cuda() for t in make_case(1, 6, 129280, gen))
            cutoff = torch.tensor([v], dtype=dtype, device="cuda")
            ref = accept_rule(candidates.cpu(), logits.cpu(), cutoff_verify_lens=cutoff.cpu())
            assert_same(accept_greedy(candidates, logits, cutoff_verify_lens=cutoff), ref)
            triton_out = tuple(torch.empty_like(t, device="cuda") for t in ref)
            triton_accept(candidates, logits, cutoff, triton_out)
            assert_same(triton_out, ref)


@needs_kernel
def test_an_admitted_call_validates_its_arguments_once(monkeypatch):
    """A caller holding the admission (the SGLang hook) costs one validation, not two."""
    import dsv41_kernels.ops.speculative.accept_greedy as op

    calls = []
    real = op._validate
    monkeypatch.setattr(op, "_validate", lambda *a: calls.append(1) or real(*a))
    candidates = torch.randint(0, 100, (2, 3), dtype=torch.int64)
    logits = torch.randn(6, 4096)
    admission = op.accept_greedy_admission(candidates, logits)
    assert admission, admission.reason
    op.accept_greedy(candidates, logits, admission=admission)
    assert len(calls) == 1
