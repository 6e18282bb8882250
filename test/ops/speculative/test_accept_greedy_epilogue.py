"""accept_greedy_epilogue: DSpark's static verify epilogue (the accept and SGLang's tail) in one
launch. The spec is the plain statement in ``reference/accept_greedy_epilogue.py``; every path
(the torch fallback, the Triton kernel under the interpreter or on a GPU, the CUDA kernels)
must give its outputs bit for bit, NaN, +-Inf and ties in the logits included, with int32 and
int64 candidates and lengths, the gated lengths' wrapping int32 arithmetic, and every output
row written (padding rows of a captured batch too)."""

from __future__ import annotations

import pytest
import torch

from dsv41_kernels import interpreter
from dsv41_kernels.ops.speculative.accept_greedy import accept_greedy
from dsv41_kernels.ops.speculative.accept_greedy_epilogue import (
    EpilogueOuts,
    accept_greedy_epilogue,
    accept_greedy_epilogue_admission,
    new_outputs,
)
from dsv41_kernels.reference.accept_greedy_epilogue import accept_greedy_epilogue as reference
from test.machine import DEVICE, needs_kernel

from .logit_cases import random_logits

CAPTURED_BS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 40, 48, 56, 64)
"""SGLang 0.5.23's captured verify batch sizes up to 64 (a sample of its list)."""


def make_case(bs, n, vocab, gen, *, cand_dtype=torch.int64, seq_dtype=torch.int64, gated=True):
    """(candidates, logits, seq_lens, verify_lens, gate): drafts that follow the argmax for a
    random prefix, logits with NaN/+-Inf/ties, prefix lengths near the dtype's top (the sum
    wraps), verify lengths of every kind SGLang's int64 buffer can hold, a gate of any int32."""
    logits = random_logits(bs * n, vocab, gen)
    predict = torch.argmax(logits, dim=-1).view(bs, n)
    candidates = torch.randint(0, vocab, (bs, n), generator=gen)
    for b in range(bs):
        keep = int(torch.randint(0, n, (1,), generator=gen))
        candidates[b, 1 : keep + 1] = predict[b, :keep]
    top = torch.iinfo(seq_dtype).max
    seq_lens = torch.randint(0, 1 << 20, (bs,), generator=gen, dtype=torch.int64)
    seq_lens[0] = top - int(torch.randint(0, 8, (1,), generator=gen))  # wraps past the top
    verify_lens = gate = None
    if gated:
        choices = torch.tensor([0, 1, n, n + 3, -2, 2**31 + 3, -(2**33) + 5, 2**40])
        verify_lens = choices[torch.randint(0, len(choices), (bs,), generator=gen)]
        verify_lens[0] = n
        gate = torch.tensor([(1, 0, 1, 3, -2)[int(torch.randint(0, 5, (1,), generator=gen))]])
        gate = gate.to(torch.int32)
        verify_lens = verify_lens.to(
            (torch.int64, torch.int32)[int(torch.randint(0, 2, (1,), generator=gen))]
        )
    return candidates.to(cand_dtype), logits, seq_lens.to(seq_dtype), verify_lens, gate


def new_outs(bs, n, device, *, seq_dtype=torch.int64, gated=True, fill=-7) -> EpilogueOuts:
    """Outputs filled with garbage, so an unwritten element shows."""
    out = new_outputs(bs, n, device, seq_dtype=seq_dtype, gated=gated)
    for t in out:
        if t is not None:
            t.fill_(fill)
    return out


def assert_same(ours: EpilogueOuts, ref) -> None:
    for name, o, r in zip(EpilogueOuts._fields, ours, ref):
        if r is None:
            assert o is None, name
            continue
        assert o.dtype == r.dtype and torch.equal(o.cpu(), r.cpu()), (name, o, r)


def run(case, device, **kwargs):
    candidates, logits, seq_lens, verify_lens, gate = case
    bs, n = candidates.shape
    out = new_outs(bs, n, device, seq_dtype=seq_lens.dtype, gated=verify_lens is not None)
    to = lambda t: None if t is None else t.to(device)
    got = accept_greedy_epilogue(
        to(candidates), to(logits), to(seq_lens), to(verify_lens), to(gate), out=out, **kwargs
    )
    assert got is out
    return out


def test_reference_by_hand():
    """Two drafts accepted, the bonus at index 2, drafts after it kept, the last slot 0."""
    vocab = 8
    logits = torch.full((4, vocab), -1.0)
    for k, token in enumerate((3, 5, 1, 7)):
        logits[k, token] = 1.0
    candidates = torch.tensor([[9, 3, 5, 2]])
    seq_lens = torch.tensor([10])
    correct, bonus, trim, commit, new_seq, tokens, gated = reference(
        candidates, logits, seq_lens, torch.tensor([2]), torch.tensor([1], dtype=torch.int32)
    )
    assert (correct.item(), bonus.item(), trim.item(), commit.item()) == (2, 1, 0, 3)
    assert new_seq.item() == 13 and gated.item() == 2
    assert tokens.tolist() == [[3, 5, 1, 0]]


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int64), (torch.int32, torch.int32)])
def test_fallback_matches_reference(monkeypatch, gated, dtypes):
    monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    gen = torch.Generator().manual_seed(20)
    for i in range(120):
        bs, n = CAPTURED_BS[i % len(CAPTURED_BS)], (6, 1, 2, 16, 64)[i % 5]
        case = make_case(bs, n, 97, gen, cand_dtype=dtypes[0], seq_dtype=dtypes[1], gated=gated)
        assert not accept_greedy_epilogue_admission(*case, out=new_outs(bs, n, "cpu", gated=gated))
        assert_same(run(case, "cpu"), reference(*case))


@needs_kernel
@pytest.mark.parametrize("gated", [True, False])
def test_kernel_matches_reference(gated):
    """The one-launch kernel (Triton here, under the interpreter; CUDA and Triton on a GPU):
    up to 64 rows at a 4099 vocabulary, and on a GPU up to 384 at V4.1's 129280."""
    gen = torch.Generator().manual_seed(21)
    on_gpu = torch.cuda.is_available()
    for i in range(200 if on_gpu else 12):
        n = (6, 1, 2, 16)[i % 4]
        bs = CAPTURED_BS[(3 * i) % len(CAPTURED_BS)]
        bs = min(bs, 384 // n) if on_gpu else min(bs, 4)
        vocab = 4099 if bs * n <= 64 else 129280
        dtypes = ((torch.int64, torch.int64), (torch.int32, torch.int32))[i % 2]
        case = make_case(bs, n, vocab, gen, cand_dtype=dtypes[0], seq_dtype=dtypes[1], gated=gated)
        moved = [None if t is None else t.to(DEVICE) for t in case]
        out = new_outs(bs, n, DEVICE, seq_dtype=dtypes[1], gated=gated)
        admission = accept_greedy_epilogue_admission(*moved, out=out)
        assert admission, admission.reason
        assert_same(run(case, DEVICE, admission=admission), reference(*case))


@needs_kernel
def test_kernel_writes_only_its_rows():
    """Static buffers are views of a larger one: rows past bs and columns past n untouched."""
    gen = torch.Generator().manual_seed(22)
    bs, n, max_bs = 3, 6, 8
    case = make_case(bs, n, 4099, gen)
    big = new_outs(max_bs, n + 2, DEVICE)
    out = EpilogueOuts(*(t[:bs] for t in big[:5]), big.out_tokens[:bs, :n], big.gated[:bs])
    to = lambda t: t.to(DEVICE)
    accept_greedy_epilogue(*(to(t) for t in case), out=out)
    assert_same(out, reference(*case))
    assert (big.out_tokens[:, n:] == -7).all()
    assert all((t[bs:] == -7).all() for t in big)


@needs_kernel
def test_epilogue_and_accept_interleave_on_one_workspace():
    """The accept and the epilogue share the accept's workspace (slots and tickets)."""
    gen = torch.Generator().manual_seed(23)
    for i in range(6):
        case = make_case(2 + i % 2, 6, 4099, gen)
        assert_same(run(case, DEVICE), reference(*case))
        candidates, logits = case[0].to(DEVICE), case[1].to(DEVICE)
        correct, bonus, _ = accept_greedy(candidates, logits)
        ref = reference(*case)
        assert torch.equal(correct.cpu().long(), ref[0]) and torch.equal(bonus.cpu(), ref[1])


def _arguments(bs=2, n=3):
    case = make_case(bs, n, 4099, torch.Generator().manual_seed(24))
    return list(case), new_outs(bs, n, "cpu")


def _replace_out(out, **changes):
    return out._replace(**changes)


BAD = [
    (lambda a, o: (a[:2] + [a[2][:1]] + a[3:], o), "seq_lens must have shape"),
    (lambda a, o: (a[:2] + [a[2].float()] + a[3:], o), "seq_lens"),
    (lambda a, o: (a[:3] + [None, a[4]], o), "verify_lens and gate"),
    (lambda a, o: (a[:4] + [torch.ones(2, dtype=torch.int32)], o), "gate must have shape"),
    (lambda a, o: (a[:4] + [a[4].long()], o), "gate"),
    (lambda a, o: (a[:3] + [None, None], o), "out.gated is given exactly"),
    (lambda a, o: (a, _replace_out(o, correct_len=o.correct_len.int())), "out.correct_len"),
    (lambda a, o: (a, _replace_out(o, new_seq_lens=o.new_seq_lens.int())), "out.new_seq_lens"),
    (lambda a, o: (a, _replace_out(o, out_tokens=o.out_tokens[:, :2])), "out.out_tokens"),
    (lambda a, o: (a, _replace_out(o, out_tokens=o.out_tokens.t())), "out.out_tokens"),
    (lambda a, o: (a, tuple(o)), "out must be an EpilogueOuts"),
    (lambda a, o: (a[:2] + [o.new_seq_lens] + a[3:], o), "seq_lens shares memory"),
    (lambda a, o: (a[:2] + [a[2].to("meta")] + a[3:], o), "seq_lens must be on cpu"),
]


@pytest.mark.parametrize("index", range(len(BAD)))
@pytest.mark.parametrize("path", ["kernel", "fallback"])
def test_bad_input_names_the_argument(monkeypatch, index, path):
    if path == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    change, match = BAD[index]
    arguments, out = change(*_arguments())
    with pytest.raises(ValueError, match=match):
        accept_greedy_epilogue(*arguments, out=out)
    verdict = accept_greedy_epilogue_admission(*arguments, out=out)
    assert not verdict and verdict.reason.startswith("invalid arguments")


# ---- GPU tier ------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_every_captured_batch_at_v41_vocab():
    """At V4.1's vocabulary (the CUDA kernels on sm_90+), every sampled captured batch size,
    three times, gated and not."""
    gen = torch.Generator().manual_seed(25)
    for i, bs in enumerate(CAPTURED_BS * 3):
        case = make_case(bs, 6, 129280, gen, gated=i % 3 != 2)
        moved = [None if t is None else t.cuda() for t in case]
        out = new_outs(bs, 6, "cuda", gated=case[3] is not None)
        admission = accept_greedy_epilogue_admission(*moved, out=out)
        assert admission, admission.reason
        assert_same(run(case, "cuda", admission=admission), reference(*case))


@pytest.mark.gpu
def test_gpu_graph_capture_and_replay():
    gen = torch.Generator().manual_seed(26)
    bs, n = 4, 6
    inputs = [t.cuda() for t in make_case(bs, n, 129280, gen)]
    out = new_outs(bs, n, "cuda")
    accept_greedy_epilogue(*inputs, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        accept_greedy_epilogue(*inputs, out=out)
    for _ in range(20):
        case = make_case(bs, n, 129280, gen)
        for dst, src in zip(inputs, case):
            dst.copy_(src)
        graph.replay()
        assert_same(out, reference(*(t.cpu() for t in inputs)))


@pytest.mark.parametrize("path", [pytest.param("kernel", marks=needs_kernel), "fallback"])
def test_broadcast_replaces_the_accept_before_the_tail(monkeypatch, path):
    """With ``broadcast``: the three accept results go through it in SGLang's order and dtypes,
    and the tail is computed from what it leaves (here rank 0's: other values than this
    rank's accept), on the kernels' two launches and on the fallback."""
    if path == "fallback":
        monkeypatch.setattr(interpreter, "RUNS_IN_INTERPRETER", False)
    gen = torch.Generator().manual_seed(27)
    bs, n = 3, 6
    candidates, logits, seq_lens, verify_lens, gate = make_case(bs, n, 4099, gen)
    rank0 = (
        torch.tensor([5, 0, 2], dtype=torch.int32),
        torch.tensor([11, 22, 33]),
        torch.tensor([0, 1, 0], dtype=torch.int32),
    )
    seen = []

    def broadcast(t):
        seen.append(t.dtype)
        t.copy_(rank0[len(seen) - 1].to(t.device))
        return t

    device = DEVICE if path == "kernel" else "cpu"
    to = lambda t: t.to(device)
    out = new_outs(bs, n, device)
    args = [to(t) for t in (candidates, logits, seq_lens, verify_lens, gate)]
    accept_greedy_epilogue(*args, out=out, broadcast=broadcast)
    assert seen == [torch.int32, torch.int64, torch.int32]
    correct, bonus, trim = rank0
    commit = correct + 1
    tokens = torch.where(
        torch.arange(n) == correct[:, None].long(),
        bonus[:, None],
        torch.cat([candidates[:, 1:], torch.zeros(bs, 1, dtype=torch.int64)], 1),
    )
    gated = torch.minimum(commit, verify_lens.to(torch.int32)) * gate
    expected = (correct.long(), bonus, trim, commit, seq_lens + commit, tokens, gated)
    assert_same(out, expected)
