"""Call site ``sharded_accept_greedy``: DSpark's verify logits at TP > 1 stay sharded for a greedy
step, and SGLang's path is whole again for every other step.

CPU tier. In this process: the admissions (the worker's configuration, each verify step's
sampling state). Two gloo ranks: SGLang 0.5.23's own ``LogitsProcessor.forward`` over a real
``GroupCoordinator``, DSpark's static verify epilogue and ``TargetVerifyExecutor.
_forward_prepared_verify``, with the plugin loaded by SGLang's ``load_plugins()`` in each
rank; SGLang's own result comes from the same callers before the deferral is armed, or with
our hooks taken out. Integers and logits are compared bit for bit, and the fire counts say
which path ran.
"""

from __future__ import annotations

import os
import types

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from test.sglang import callers
from test.sglang.cpu_import import import_sglang

WIDTH = 4100  # the lm_head's columns per rank (>= the row-argmax kernel's 4096)
VOCAB = 2 * WIDTH - 37  # the last rank's shard ends in 37 padding columns
BS = 3


@pytest.fixture
def forced(monkeypatch):
    from dsv41_kernels.sglang_plugin.switches import FORCE_ENV

    monkeypatch.setenv(FORCE_ENV, "sharded_accept_greedy")


@pytest.fixture
def two_ranks(monkeypatch):
    """This process stated as rank 0 of a TP group of 2 (for the admissions only)."""
    from dsv41_kernels.sglang_plugin import sharded_accept_greedy as hooks

    tp = types.SimpleNamespace(world_size=2, rank_in_group=0, device_group=None)
    monkeypatch.setattr(hooks.parallel_state, "get_tp_group", lambda: tp)


def worker_and_processor(**epilogue_fields):
    processor = callers.target_logits_processor(VOCAB)
    epilogue = callers.verify_epilogue(BS, "cpu")
    for name, value in epilogue_fields.items():
        setattr(epilogue, name, value)
    return callers.dspark_worker(epilogue, processor), processor


def test_off_until_run_on_several_gpus(plugin, fired):
    from dsv41_kernels.sglang_plugin import sharded_accept_greedy as hooks
    from dsv41_kernels.sglang_plugin.deferred_verify import deferral_of

    worker, processor = worker_and_processor()
    hooks.arm_hook(None, worker)
    assert deferral_of(processor) is None
    assert fired()["sharded_accept_greedy.arm"] == {"ours": 0, "sglang": {hooks.UNRUN: 1}}


CONFIGURATIONS = [
    # (what changes, the refusal's words)
    (lambda w, p, m: None, None),
    (lambda w, p, m: setattr(w._verify_epilogue, "_fused_accept_tail", True), "FUSED_ACCEPT_TAIL"),
    (lambda w, p, m: setattr(w._verify_epilogue, "simulate_fold", True), "SIMULATE_FOLD"),
    (lambda w, p, m: setattr(w, "_verify_epilogue", None), "no in-graph verify epilogue"),
    (lambda w, p, m: setattr(w._verify_planner, "mode_value", "compact"), "static"),
    (lambda w, p, m: setattr(w, "_sampling_accept_graph", object()), "SAMPLING_ACCEPT_GRAPH"),
    (lambda w, p, m: setattr(w, "_hosts_draft", False), "pipeline stage"),
    (lambda w, p, m: setattr(p, "final_logit_softcapping", 30.0), "softcapped"),
    (lambda w, p, m: setattr(p, "do_tensor_parallel_all_gather_dp_attn", True), "all-gathered"),
    (lambda w, p, m: setattr(p, "use_attn_tp_group", True), "all-gathered"),
    (lambda w, p, m: w.target_worker.model_runner.model.add_module("x", p), None),  # same one
    (
        lambda w, p, m: w.target_worker.model_runner.model.add_module(
            "draft_head", callers.target_logits_processor(VOCAB)
        ),
        "2 LogitsProcessors",
    ),
    (lambda w, p, m: m.setenv("SGLANG_DSPARK_STS_COLLECT_PATH", "/tmp/sts"), "STS_COLLECT"),
    (
        lambda w, p, m: m.setenv("SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS", "1"),
        "CONFIDENCE_METRICS",
    ),
]


@pytest.mark.parametrize("change,refusal", CONFIGURATIONS)
def test_defer_admission(plugin, forced, two_ranks, monkeypatch, change, refusal):
    from dsv41_kernels.sglang_plugin import sharded_accept_greedy as hooks

    worker, processor = worker_and_processor()
    change(worker, processor, monkeypatch)
    verdict = hooks.defer_admission(worker)
    if refusal is None:
        assert verdict and verdict.reason == "TP 2: gather deferred", verdict
    else:
        assert not verdict and refusal in verdict.reason, verdict


def test_accept_on_shard_honours_the_refusal(plugin, monkeypatch):
    """Arguments SGLang's accept refuses reach SGLang's accept of the gathered logits, never
    our sharded accept, even where ours would take them (a refusal is a falsy Admission)."""
    from dsv41_kernels.admission import admit, refuse
    from dsv41_kernels.sglang_plugin import deferred_verify

    ours_admits = lambda *args, **kwargs: admit("triton")
    monkeypatch.setattr(deferred_verify, "sharded_accept_greedy_admission", ours_admits)
    monkeypatch.setattr(deferred_verify, "sharded_accept_greedy", lambda *a, **k: "ours")

    shard = torch.randn(BS * 6, WIDTH)
    gathered = torch.randn(BS * 6, VOCAB)
    deferred = types.SimpleNamespace(
        own_columns=lambda t: t, vocab_start=0, group=None, gather=lambda t: gathered
    )
    seen = {}

    def original(**kwargs):
        seen.update(kwargs)
        return "sglang's accept"

    kwargs = dict(candidates=torch.zeros(BS, 6, dtype=torch.int64), target_logits=shard)
    refusal = refuse("logits rows != bs * verify_num_draft_tokens")
    result = deferred_verify.accept_on_shard(deferred, original, kwargs, refusal)
    assert result == "sglang's accept" and seen["target_logits"] is gathered
    assert deferred_verify.accept_on_shard(deferred, original, kwargs, None) == "ours"


def test_defer_admission_needs_tp_and_the_accept_site(plugin, forced, monkeypatch):
    from dsv41_kernels.sglang_plugin import sharded_accept_greedy as hooks

    worker, _ = worker_and_processor()
    one = types.SimpleNamespace(world_size=1, rank_in_group=0, device_group=None)
    monkeypatch.setattr(hooks.parallel_state, "get_tp_group", lambda: one)
    assert "TP 1" in hooks.defer_admission(worker).reason
    monkeypatch.setattr(hooks, "status", lambda: {"accept_greedy": "off (DSV41_KERNELS_DISABLE)"})
    assert "accept_greedy call site is off" in hooks.defer_admission(worker).reason


def test_a_worker_built_otherwise_is_left_unarmed(plugin, forced, two_ranks, fired):
    """An attribute the admission reads missing (another SGLang) refuses; it never raises
    out of the worker's constructor."""
    from dsv41_kernels.sglang_plugin import sharded_accept_greedy as hooks

    worker, processor = worker_and_processor()
    del worker._target_worker
    hooks.arm_hook(None, worker)
    (reason,) = fired()["sharded_accept_greedy.arm"]["sglang"]
    assert reason.startswith("cannot read the worker's configuration: ")  # SGLang recurses


def test_verify_step_admission(plugin):
    from dsv41_kernels.sglang_plugin.sharded_accept_greedy import verify_step_admission

    greedy = callers.sampling_info([0.0] * BS, VOCAB)
    assert verify_step_admission(callers.verify_batch())
    assert verify_step_admission(callers.verify_batch(greedy))
    refused = {
        "temperature > 0": callers.verify_batch(callers.sampling_info([0.0, 0.8, 0.0], VOCAB)),
        "logprobs": callers.verify_batch(greedy, return_logprob=True),
        "grammar": callers.verify_batch(greedy, has_grammar=True),
    }
    bias = callers.sampling_info([0.0] * BS, VOCAB)
    bias.logit_bias = torch.zeros(BS, VOCAB)
    refused["logit adjustments"] = callers.verify_batch(bias)
    custom = callers.sampling_info([0.0] * BS, VOCAB)
    custom.has_custom_logit_processor = True
    refused["logit adjustments "] = callers.verify_batch(custom)
    masks = callers.sampling_info([0.0] * BS, VOCAB)
    masks.sampling_mask_batch_indices = torch.arange(BS)
    refused["sampling masks"] = callers.verify_batch(masks)
    for words, batch in refused.items():
        verdict = verify_step_admission(batch)
        assert not verdict and words.strip() in verdict.reason, (words, verdict)


# ---- two gloo ranks running SGLang's verify path ------------------------------------------------


def rank_lm_head(rank: int, gen):
    """The rank's rows of a vocabulary-parallel lm_head (bf16): padding rows that would win
    every argmax if they were read, and one column repeated across the shard boundary."""
    weight = torch.randn(2 * WIDTH, 16, generator=gen)
    weight[VOCAB:] = 8.0
    weight[WIDTH] = weight[WIDTH - 1]
    weight = weight.to(torch.bfloat16)
    return types.SimpleNamespace(weight=weight[rank * WIDTH : (rank + 1) * WIDTH]), weight


def verify_step(executor, info):
    return executor._forward_prepared_verify(
        batch=callers.verify_batch(info),
        verify_input=callers.verify_input(),
        seq_lens_cpu_backup=None,
        seq_lens_sum_backup=0,
    ).logits_output.next_token_logits


def check_tp_verify(rank: int) -> None:
    from sglang.kernels.ops.speculative.dspark import dspark_accept

    from dsv41_kernels.sglang_plugin import deferred_verify, dispatch
    from dsv41_kernels.sglang_plugin import sharded_accept_greedy as hooks

    gen = torch.Generator().manual_seed(19)  # the same draws on both ranks
    head, _ = rank_lm_head(rank, gen)
    hidden = torch.randn(BS * callers.VERIFY_ROWS, 16, generator=gen).to(torch.bfloat16)
    processor = callers.target_logits_processor(VOCAB)
    forward = lambda mode="TARGET_VERIFY": callers.logits_forward(processor, head, hidden, mode)
    full = forward().next_token_logits  # SGLang's own: not armed yet, gathered
    assert full.shape == (hidden.shape[0], VOCAB) and full.dtype == torch.float32

    epilogue = callers.verify_epilogue(BS, "cpu")
    hooks.arm_hook(None, callers.dspark_worker(epilogue, processor))
    dispatch.reset()
    executor = callers.verify_executor(forward)

    # A greedy step keeps the shard: this rank's columns, bit for bit.
    shard = verify_step(executor, callers.sampling_info([0.0] * BS, VOCAB))
    assert shard.shape == (hidden.shape[0], WIDTH)
    own = min(WIDTH, VOCAB - rank * WIDTH)
    assert torch.equal(shard[:, :own], full[:, rank * WIDTH : rank * WIDTH + own])

    # DSpark's in-graph greedy accept on the shard equals SGLang's on the gathered logits.
    candidates = callers.draft_candidates(full, BS, gen)
    ours = callers.StaticVerifyStep(candidates, shard).run(epilogue)
    with callers.sglang_functions(dspark_accept):
        sglang = callers.StaticVerifyStep(candidates, full).run(
            callers.verify_epilogue(BS, "cpu", fused_argmax=False)
        )
    for name, value in sglang.items():
        assert ours[name].dtype == value.dtype and torch.equal(ours[name], value), name

    # A step with a sampled request gets SGLang's gathered logits back, bit for bit.
    gathered = verify_step(executor, callers.sampling_info([0.0, 0.7, 0.0], VOCAB))
    assert torch.equal(gathered.view(torch.int32), full.view(torch.int32))
    # Not a verify forward: SGLang's gather.
    assert torch.equal(forward("DECODE").next_token_logits, full)

    counts = dispatch.fire_counts()
    assert counts["sharded_accept_greedy.gather"] == {"ours": 2, "sglang": {}}, counts
    assert counts["sharded_accept_greedy.lm_head"] == {
        "ours": 2,
        "sglang": {"not a target-verify forward": 1},
    }, counts
    assert counts["sharded_accept_greedy.accept"] == {"ours": 1, "sglang": {}}, counts
    assert counts["sharded_accept_greedy.finish"] == {
        "ours": 1,
        "sglang": {"temperature > 0: a sampled accept": 1},
    }, counts

    # Our accept failing is raised on the rank, not fallen back from: a rank gathering logits
    # alone would meet the other ranks' key gathers with a collective of another shape.
    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    deferred_verify.sharded_accept_greedy = broken
    with pytest.raises(RuntimeError, match="injected"):
        callers.StaticVerifyStep(candidates, shard).run(callers.verify_epilogue(BS, "cpu"))
    assert "raised on 1 of 2 ranks: RuntimeError: injected" in str(
        dispatch.fire_counts()["sharded_accept_greedy.accept"]
    )


def tp_verify_rank(rank: int, store: str) -> None:
    from dsv41_kernels.sglang_plugin.switches import FORCE_ENV

    os.environ.update({"SGLANG_PLUGINS": "dsv41_kernels", FORCE_ENV: "sharded_accept_greedy"})
    os.environ.pop("DSV41_KERNELS_DISABLE", None)
    import_sglang()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        callers.tp_group(rank, 2)
        check_tp_verify(rank)
    finally:
        dist.destroy_process_group()


def test_greedy_verify_at_tp2_gathers_keys_not_logits(sglang, tmp_path):
    # Forked from a server without SGLang, so each rank imports it (and loads the plugin).
    mp.set_forkserver_preload([__name__])
    store = str(tmp_path / "store")
    mp.start_processes(tp_verify_rank, args=(store,), nprocs=2, start_method="forkserver")
