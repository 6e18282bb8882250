"""The ``accept_greedy_epilogue`` hook inside SGLang 0.5.23's own caller: DSpark's static verify
epilogue (``_static_epilogue`` -> ``run_static`` -> ``_accept_static_greedy``), with the KV
commit folded in as a V4.1 server has it, so the gated commit lengths reach the injector.
CPU: ours (the Triton kernel under the interpreter) writes SGLang's six static buffers and
hands the injector SGLang's gated lengths, bit for bit, NaN rows and padding rows included; the
hook declines, and says why, wherever SGLang's steps must run. GPU (the H200): the same in a
captured graph at V4.1's vocabulary, forced (no policy range is measured yet)."""

from __future__ import annotations

import types

import pytest
import torch

from test.sglang import callers

HOOK = "accept_greedy_epilogue._accept_static_greedy"
ACCEPT_HOOKS = ("accept_greedy.accept_greedy", "accept_greedy.accept_greedy_triton")
FIELDS = ("correct_len", "bonus", "cap_trim_lens", "commit_lens", "new_seq_lens", "out_tokens")


class CommitStep(callers.StaticVerifyStep):
    """A static verify step of ``live`` requests in a batch captured at ``bs`` (padding rows:
    stale drafts, prefix length 1, verify length 0), whose epilogue folds the KV commit: the
    gated commit lengths it hands the injector are recorded."""

    def __init__(self, candidates, logits, live: int):
        super().__init__(candidates, logits)
        self.live = live
        self.batch.seq_lens[live:] = 1  # SGLang's graph fill value for the DSv4 backend
        self.injected = []

    def epilogue(self, bs, **flags):
        from sglang.srt.speculative.dspark_components.dspark_verify import CommitInjectCtx

        pool = types.SimpleNamespace(set_swa_key_buffer_radix_fused_norm_rope=None)
        injector = types.SimpleNamespace(
            swa_ring_size=None,
            inject_target_hidden=lambda **kw: self.injected.append(kw["commit_lens"].clone()),
        )
        ctx = CommitInjectCtx(
            draft_model=None,
            block_pos_offsets=None,
            resolve_pool=lambda: pool,
            resolve_req_to_token=None,
            kv_injector=injector,
        )
        return callers.verify_epilogue(
            bs, self.out.next_token_logits.device, commit_ctx=ctx, **flags
        )

    def run(self, epilogue):
        """``_static_epilogue`` with the gate armed; the buffers and the injected lengths."""
        epilogue.begin_static_step(self.live, True)
        epilogue._static_epilogue(self.out, self.batch)
        buffers = callers.read_accept(epilogue, self.batch.batch_size)
        return buffers, self.injected.pop()


def commit_step(bs, live, seed, vocab, *, nan=True, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    logits = callers.verify_logits(gen, bs, vocab, nan=nan).to(device)
    return CommitStep(callers.draft_candidates(logits, bs, gen), logits, live)


def assert_same(ours, stock, what=""):
    (buffers, gated), (stock_buffers, stock_gated) = ours, stock
    for name in FIELDS:
        a, b = buffers[name], stock_buffers[name]
        assert a.dtype == b.dtype and torch.equal(a, b), (what, name, a, b)
    assert gated.dtype == stock_gated.dtype and torch.equal(gated, stock_gated), (what, gated)


@pytest.mark.parametrize("bs,live", [(1, 1), (3, 3), (4, 2)])
def test_ours_writes_sglangs_buffers_through_its_caller(plugin, fired, bs, live):
    step = commit_step(bs, live, seed=bs, vocab=4099)
    ours = step.run(step.epilogue(bs))
    counts = fired()
    assert counts[HOOK] == {"ours": 1, "sglang": {}}, counts
    assert not any(counts.get(hook, {}).get("ours") for hook in ACCEPT_HOOKS), counts
    with callers.stock_epilogue():
        stock = step.run(step.epilogue(bs))
    assert_same(ours, stock)
    assert (ours[1][live:] == 0).all()  # padding rows commit nothing


DECLINES = {
    "fused tail": (dict(fused_accept_tail=True), "SGLang's fused accept tail serves it"),
    "simulated length": (
        dict(simulated_correct_len=torch.tensor([2], dtype=torch.int32)),
        "simulated accept length",
    ),
}


@pytest.mark.parametrize("case", sorted(DECLINES))
def test_declines_where_sglangs_steps_must_run(plugin, fired, case):
    """SGLang's own path runs, reason counted, with the same results as the stock server."""
    flags, reason = DECLINES[case]
    step = commit_step(2, 2, seed=11, vocab=4099)
    epilogue = step.epilogue(2, **flags)
    declined = step.run(epilogue)
    (why,) = fired()[HOOK]["sglang"]
    assert reason in why, why
    with callers.stock_epilogue():
        stock = step.run(step.epilogue(2, **flags))
    assert_same(declined, stock, case)


@pytest.mark.parametrize("rank0", [False, True], ids=["own values", "rank 0's values"])
def test_takes_the_epilogue_under_the_tp_broadcast(plugin, fired, rank0):
    """At TP 2 with the accept-site broadcast (SGLang's default there): ours makes SGLang's
    three broadcasts, in its order and dtypes, between its two launches, and its buffers equal
    the stock epilogue's given the same broadcast values (rank 0's, other than this rank's)."""
    values = None
    if rank0:
        values = (
            torch.tensor([4, 1], dtype=torch.int32),
            torch.tensor([7, 9]),
            torch.tensor([0, 0], dtype=torch.int32),
        )
    step = commit_step(2, 2, seed=14, vocab=4099)
    epilogue = step.epilogue(2, world_size=2, rank0_values=values)
    ours = step.run(epilogue)
    assert fired()[HOOK] == {"ours": 1, "sglang": {}}
    assert [t.dtype for t in epilogue.broadcasts] == [torch.int32, torch.int64, torch.int32]
    with callers.stock_epilogue():
        stock_epilogue = step.epilogue(2, world_size=2, rank0_values=values)
        stock = step.run(stock_epilogue)
    assert [t.dtype for t in stock_epilogue.broadcasts] == [t.dtype for t in epilogue.broadcasts]
    assert_same(ours, stock, "TP broadcast")
    if rank0:
        assert ours[0]["bonus"].tolist() == [7, 9]


def test_declines_with_the_block_accept_lengths(plugin, fired):
    from sglang.srt.environ import envs

    step = commit_step(2, 2, seed=12, vocab=4099)
    with envs.SGLANG_OPT_DSV41_POST_FORWARD_CUDA_GRAPH.override(True):
        epilogue = step.epilogue(2)
    step.run(epilogue)
    (why,) = fired()[HOOK]["sglang"]
    assert "block accept lengths" in why, why


# ---- GPU tier ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("bs", [1, 2, 4, 6, 10, 16, 32, 64])
def test_gpu_captured_epilogue_equals_sglangs(plugin, fired, monkeypatch, bs):
    """Forced (the H200's policy has no measured range yet): captured after an eager warm-up,
    replayed with new logits and drafts, NaN rows in every other replay. Each replay's buffers
    and gated lengths equal SGLang's stock epilogue over torch.argmax (its V4.1 argmax agrees
    where no row holds NaN)."""
    monkeypatch.setenv("DSV41_KERNELS_FORCE", "accept_greedy_epilogue")
    step = commit_step(bs, max(1, bs - 1), seed=bs, vocab=129280, device="cuda")
    epilogue = step.epilogue(bs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step.run(epilogue)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        epilogue._static_epilogue(step.out, step.batch)
    gated = step.injected.pop()  # the capture's: the graph writes this tensor at each replay
    assert fired()[HOOK] == {"ours": 2, "sglang": {}}
    for replay in range(4):
        nan = replay % 2 == 0
        new = commit_step(bs, step.live, 100 * bs + replay, 129280, nan=nan, device="cuda")
        step.out.next_token_logits.copy_(new.out.next_token_logits)
        step.batch.input_ids.copy_(new.batch.input_ids)
        graph.replay()
        torch.cuda.synchronize()
        ours = callers.read_accept(epilogue, bs), gated.clone()
        for fused_argmax in (False,) if nan else (False, True):
            with callers.stock_epilogue():
                stock = new.run(new.epilogue(bs, fused_argmax=fused_argmax))
            assert_same(ours, stock, f"replay {replay}, SGLang's argmax {fused_argmax}")


def test_verify_cycle_group_runs_both_arms(plugin, fired):
    """``benchmark/verify_cycle``'s epilogue group: SGLang's arm runs its steps (our hooks out),
    ours the one launch; both give the same gated commit lengths."""
    from benchmark import verify_cycle

    run, patch, _ = verify_cycle.epilogue_group(torch.device("cpu"))
    stock = verify_cycle.with_sglang_functions(run, patch)().clone()
    counts = fired()
    assert HOOK not in counts and not any(hook in counts for hook in ACCEPT_HOOKS), counts
    ours = run()
    assert fired()[HOOK] == {"ours": 1, "sglang": {}}
    assert ours.dtype == stock.dtype and torch.equal(ours, stock)


def test_declines_where_our_accept_would_not_run(plugin, fired, monkeypatch):
    """The epilogue computes our accept's bits: it declines where the ``accept_greedy`` call
    site is off (switched off, off after an error), and SGLang's steps run."""
    import dsv41_kernels.sglang_plugin as plugin_module
    from dsv41_kernels.sglang_plugin import dispatch

    installed = plugin_module.status()
    off = {**installed, "accept_greedy": "off (DSV41_KERNELS_DISABLE)"}
    monkeypatch.setattr(plugin_module, "_registered", off)  # as install() leaves it then
    step = commit_step(2, 2, seed=13, vocab=4099)
    step.run(step.epilogue(2))
    (why,) = fired()[HOOK]["sglang"]
    assert why == "accept_greedy switched off (DSV41_KERNELS_DISABLE)", why
    monkeypatch.setattr(plugin_module, "_registered", installed)
    dispatch.reset()
    monkeypatch.setitem(dispatch._failed, "accept_greedy.accept_greedy_triton", "RuntimeError: x")
    step.run(step.epilogue(2))
    (why,) = fired()[HOOK]["sglang"]
    assert why == "accept_greedy is off after an error", why
