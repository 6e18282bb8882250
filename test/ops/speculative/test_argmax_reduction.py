"""The shared Triton argmax workspace under interrupted launches, threads and unordered streams."""

import threading

import pytest
import torch
from triton.runtime import interpreter as triton_interpreter_runtime
from triton.runtime.errors import InterpreterError

from dsv41_kernels.admission import triton_interpreter
from dsv41_kernels.ops.speculative.accept_greedy import CLUSTER_WORKSPACE, accept_greedy
from dsv41_kernels.ops.speculative.argmax_plan import triton_launch
from dsv41_kernels.ops.speculative.argmax_reduction import EMPTY_SLOT, TRITON_WORKSPACE
from dsv41_kernels.ops.speculative.row_argmax import launch_triton, row_argmax
from dsv41_kernels.reference.accept_greedy import accept_greedy as accept_rule

from .logit_cases import random_logits

TRITON_6_ROWS = triton_launch(6, 129280)

interpreted = pytest.mark.skipif(
    not triton_interpreter(), reason="an interpreted launch is what can stop halfway"
)


def assert_workspace_armed(device):
    slots, ticket = TRITON_WORKSPACE.get(device)
    assert bool((slots == EMPTY_SLOT).all()) and int(ticket) == 0


def interrupt_at_program(monkeypatch, program: int, error: type[BaseException]):
    """Make the interpreter raise ``error`` as it starts program ``program`` of a launch."""
    builder = triton_interpreter_runtime.interpreter_builder
    set_grid_idx = builder.set_grid_idx
    started = [0]

    def counting(x, y, z):
        started[0] += 1
        if started[0] == program + 1:
            raise error("injected")
        set_grid_idx(x, y, z)

    monkeypatch.setattr(builder, "set_grid_idx", counting)


def accept_case(gen, bs=2, n=3, vocab=8192):
    logits = random_logits(bs * n, vocab, gen)
    predict = torch.argmax(logits, -1).view(bs, n)
    candidates = torch.zeros(bs, n, dtype=torch.int64)
    candidates[:, 1:] = predict[:, :-1]
    return candidates, logits


@interpreted
@pytest.mark.parametrize(
    "error, raised", [(KeyboardInterrupt, KeyboardInterrupt), (RuntimeError, InterpreterError)]
)
def test_an_interrupted_launch_leaves_the_workspace_armed(monkeypatch, error, raised):
    """Programs that ran before the interrupt filled slots and counted the ticket; the launch
    puts both back, so later calls on other shapes, and the accept, stay exact."""
    gen = torch.Generator().manual_seed(0)
    big = random_logits(64, 20000, gen)
    assert triton_launch(64, 20000).grid(64, 20000)[0] > 1  # several programs per row
    with monkeypatch.context() as patch:
        interrupt_at_program(patch, 40, error)
        with pytest.raises(raised):
            row_argmax(big)
    assert_workspace_armed(big.device)
    for _ in range(3):
        x = random_logits(6, 8192, gen)
        assert torch.equal(row_argmax(x), torch.argmax(x, -1))
        candidates, logits = accept_case(gen)
        for ours, ref in zip(accept_greedy(candidates, logits), accept_rule(candidates, logits)):
            assert torch.equal(ours, ref)


@interpreted
def test_an_interrupted_accept_leaves_the_workspace_armed(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    candidates, logits = accept_case(gen, bs=4, n=6, vocab=12000)
    with monkeypatch.context() as patch:
        interrupt_at_program(patch, 7, KeyboardInterrupt)
        with pytest.raises(KeyboardInterrupt):
            accept_greedy(candidates, logits)
    assert_workspace_armed(logits.device)
    for ours, ref in zip(accept_greedy(candidates, logits), accept_rule(candidates, logits)):
        assert torch.equal(ours, ref)


@interpreted
def test_threads_calling_at_once_stay_exact():
    """The interpreter's launches take turns: three threads of argmaxes and accepts at once."""
    failures = []

    def work(seed):
        gen = torch.Generator().manual_seed(seed)
        for i in range(4):
            if (seed + i) % 2:
                x = random_logits(6, 4096 + seed * 100, gen)
                ok = torch.equal(row_argmax(x), torch.argmax(x, -1))
            else:
                candidates, logits = accept_case(gen)
                ok = all(
                    torch.equal(o, r)
                    for o, r in zip(
                        accept_greedy(candidates, logits), accept_rule(candidates, logits)
                    )
                )
            failures.extend([] if ok else [(seed, i)])

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert_workspace_armed(torch.device("cpu"))


# ---- GPU tier ------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_unordered_streams_each_have_a_workspace():
    """Launches on two streams with no ordering between them, many in flight at once: every
    result exact, for the Triton kernel and for the public op (the CUDA kernels on sm_90+)."""
    gen = torch.Generator().manual_seed(2)
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [[random_logits(6, 129280, gen).cuda() for _ in range(8)] for _ in streams]
    outs = [[torch.empty(6, dtype=torch.int64, device="cuda") for _ in range(8)] for _ in streams]
    triton_outs = [[torch.empty_like(o) for o in row] for row in outs]
    accepts = [
        [tuple(t.cuda() for t in accept_case(gen, bs=1, n=6, vocab=129280)) for _ in range(8)]
        for _ in streams
    ]
    torch.cuda.synchronize()
    results = [[], []]
    for _ in range(20):
        for s, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                for i in range(8):
                    row_argmax(inputs[s][i], out=outs[s][i])
                    launch_triton(inputs[s][i], triton_outs[s][i], TRITON_6_ROWS)
                    results[s].append(accept_greedy(*accepts[s][i]))
    torch.cuda.synchronize()
    for s in range(2):
        for i in range(8):
            ref = torch.argmax(inputs[s][i], -1)
            assert torch.equal(outs[s][i], ref) and torch.equal(triton_outs[s][i], ref)
        for k, got in enumerate(results[s]):
            c, lg = accepts[s][k % 8]
            for ours, ref in zip(got, accept_rule(c.cpu(), lg.cpu())):
                assert torch.equal(ours.cpu(), ref)
    for workspace in (TRITON_WORKSPACE, CLUSTER_WORKSPACE):
        with torch.cuda.stream(streams[0]):
            first = workspace.get(torch.device("cuda", 0))
        with torch.cuda.stream(streams[1]):
            second = workspace.get(torch.device("cuda", 0))
        assert first[0].data_ptr() != second[0].data_ptr()


@pytest.mark.gpu
def test_gpu_capture_on_a_stream_first_seen_in_capture():
    """Warm up on one side stream, capture on another (torch.cuda.graph's own): the graph
    takes the device's first workspace without allocating, and replays exactly."""
    gen = torch.Generator().manual_seed(3)
    warm = torch.cuda.Stream()
    x = random_logits(6, 129280, gen).cuda()
    out = torch.empty(6, dtype=torch.int64, device="cuda")
    triton_out = torch.empty_like(out)
    with torch.cuda.stream(warm):
        row_argmax(x, out=out)
        launch_triton(x, triton_out, TRITON_6_ROWS)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        row_argmax(x, out=out)
        launch_triton(x, triton_out, TRITON_6_ROWS)
    for _ in range(10):
        x.copy_(random_logits(6, 129280, gen).cuda())
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.argmax(x, -1)
        assert torch.equal(out, ref) and torch.equal(triton_out, ref)
