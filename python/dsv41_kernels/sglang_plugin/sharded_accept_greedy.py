"""Call site ``sharded_accept_greedy``: DSpark's target verify at TP > 1 -> the greedy accept on
the vocab shards, the logits all-gather skipped.

SGLang 0.5.23 (``sglang/srt/layers/logits_processor.py``): ``LogitsProcessor._get_logits``
(line 953) computes this rank's ``[rows, vocab / tp]`` slice of the verify logits with the
vocabulary-parallel ``lm_head`` and all-gathers it (``self._logits_gatherer(logits)``, line
1036) into ``[rows, vocab]``, cast to fp32, on every rank. DSpark's static verify of a
DeepSeek-V4.1 target then runs its greedy accept inside the verify CUDA graph
(``dspark_verify.py``: ``DsparkVerifyEpilogue.capture_hook`` line 672 -> ``_static_epilogue``
727 -> ``_accept_static_greedy`` 795 -> ``_accept`` 1043 -> ``AcceptGreedy.execute`` ->
``accept_greedy_triton``), and after the forward SGLang reads the gathered logits again only
for what a greedy step does not ask for: the eager accept of a sampled step, grammar masks,
logit adjustments, logprobs, sampling masks, debug observers (``dspark_worker_v2.py`` lines
1179-1310). SGLang defines the contract for skipping this gather itself, for DFlash with a
softcapped target (``defer_verify_gather``, lines 491 and 1011-1022 there; the worker's half in
``dflash_worker_v2.py`` lines 617-627 and 2887-2898): the verify forward leaves the vocab shard,
and the worker either takes the argmax from per-rank candidates or finishes the gather. DSpark
does not use it, and V4.1 has no softcap, so here it is, in four hooks:

- ``DSparkWorkerV2.__init__`` (AFTER): decides once per worker whether the deferral is safe
  (:func:`defer_admission`, from TP-replicated configuration only, so every rank decides the
  same) and records the target's one ``LogitsProcessor``;
- ``LogitsProcessor._get_logits`` (AROUND): at a target-verify forward of that processor,
  marks the call, and ``MultimemAllGatherer.__call__`` (AROUND) then returns the shard
  instead of gathering it: the verify graph is captured without the gather;
- the greedy accept (call site ``accept_greedy``: :func:`accept_on_shard`) takes the shard through
  :func:`~dsv41_kernels.ops.speculative.sharded_accept_greedy.sharded_accept_greedy`: one
  int64 key per row and rank is gathered instead of the logits;
- ``TargetVerifyExecutor._forward_prepared_verify`` (AROUND, ``dspark_verify.py`` line 346):
  after every verify forward, a step whose greedy accept is not the only consumer
  (:func:`verify_step_admission`: temperature > 0, logprobs, grammar, logit adjustments,
  sampling masks) gets the full logits back through SGLang's own gatherer and cast, bit for bit
  what its forward would have returned; only an all-greedy step keeps the shard.

Which one ran is in the fire counts: ``sharded_accept_greedy.arm`` (per worker), ``.lm_head`` and
``.gather`` (per verify forward: the gather skipped), ``.accept`` (the sharded accept, or the
gather and SGLang's accept when ours cannot take it), ``.finish`` (the shard kept, or gathered
after the forward and why). The deferral is off until the several-GPU tests and benchmark
have run (issue 19); ``DSV41_KERNELS_FORCE=sharded_accept_greedy`` turns it on.
"""

from __future__ import annotations

from sglang.srt.distributed import parallel_state
from sglang.srt.environ import envs
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.plugins.hook_registry import HookType
from sglang.srt.speculative.dspark_components.dspark_verify import (
    verify_logits_adjustments_are_noop,
)

from dsv41_kernels.admission import Admission, admit, refuse
from dsv41_kernels.sglang_plugin import dispatch, status
from dsv41_kernels.sglang_plugin.deferred_verify import (
    DeferredVerify,
    arm,
    deferral_of,
    deferred_shard,
    in_deferred_forward,
)
from dsv41_kernels.sglang_plugin.switches import FORCE_ENV, forced

SWITCH = "sharded_accept_greedy"
_LOGITS = "sglang.srt.layers.logits_processor.LogitsProcessor"
_GATHERER = "sglang.srt.distributed.device_communicators.triton_symm_mem_ag.MultimemAllGatherer"
_WORKER = "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2"
_EXECUTOR = "sglang.srt.speculative.dspark_components.dspark_verify.TargetVerifyExecutor"
UNRUN = (
    f"not yet run on several GPUs (issue 19: NCCL tests and benchmark pending); "
    f"{FORCE_ENV}={SWITCH} turns it on"
)
# Debug observers that read the verify logits after the forward (dspark_observability.py).
_LOGIT_READERS = (
    "SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS",
    "SGLANG_DSPARK_STS_COLLECT_PATH",
    "SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH",
    "SGLANG_DSPARK_BLOCK_ACCEPT_ONLINE_INTERVAL",
)


def _target_processors(worker) -> list:
    model = worker.target_worker.model_runner.model
    return [m for m in model.modules() if isinstance(m, LogitsProcessor)]


def defer_admission(worker) -> Admission:
    """Whether the verify gather may be deferred for this DSpark worker: the greedy in-graph
    epilogue is the only reader of the logits inside the verify graph. Reads configuration
    only, identical on every TP rank."""
    if not forced(SWITCH):
        return refuse(UNRUN)
    if (status() or {}).get("accept_greedy") != "on":
        return refuse("the accept_greedy call site is off: its hooks take the sharded accept")
    if not getattr(worker, "_hosts_draft", False):
        return refuse("this pipeline stage runs no DSpark verify")
    if parallel_state.get_tp_group().world_size < 2:
        return refuse("TP 1: the verify logits are not gathered")
    epilogue = getattr(worker, "_verify_epilogue", None)
    if epilogue is None:
        return refuse("no in-graph verify epilogue (static verify of a V4.1 target, CUDA graphs)")
    if getattr(getattr(worker, "_verify_planner", None), "mode_value", None) != "static":
        return refuse("not SGLANG_RAGGED_VERIFY_MODE=static: the compact epilogue scatters logits")
    if getattr(worker, "_sampling_accept_graph", "unknown") is not None:
        return refuse("SGLANG_OPT_DSV41_SAMPLING_ACCEPT_GRAPH: its graph reads the verify logits")
    if getattr(epilogue, "simulate_fold", True) or getattr(epilogue, "_fused_accept_tail", True):
        return refuse("SGLANG_DSPARK_SIMULATE_FOLD / FUSED_ACCEPT_TAIL read the logits in-graph")
    readers = [name for name in _LOGIT_READERS if getattr(envs, name).get()]
    if readers:
        return refuse(f"{', '.join(readers)} read the verify logits")
    processors = _target_processors(worker)
    if len(processors) != 1:
        return refuse(f"{len(processors)} LogitsProcessors in the target model, expected 1")
    lp = processors[0]
    if (
        not lp.do_tensor_parallel_all_gather
        or lp.use_attn_tp_group
        or lp.do_tensor_parallel_all_gather_dp_attn
        or lp.use_tp_lm_head_all_to_all
    ):
        return refuse("the logits are not all-gathered over the TP group by its gatherer")
    if lp.final_logit_softcapping or lp.defer_verify_gather:
        return refuse("softcapped logits: SGLang's own deferred gather")
    return admit("deferred", f"TP {parallel_state.get_tp_group().world_size}: gather deferred")


def _arm(worker) -> None:
    tp = parallel_state.get_tp_group()
    (lp,) = _target_processors(worker)
    arm(DeferredVerify(lp, tp.device_group, tp.rank_in_group))


def arm_hook(result, worker, *args, **kwargs) -> None:
    """``DSparkWorkerV2.__init__`` (AFTER): arm the deferral for the target's processor. A
    worker this SGLang builds differently (an attribute read here missing) is left unarmed,
    never failed."""
    try:
        admission = defer_admission(worker)
    except Exception as e:
        admission = refuse(f"cannot read the worker's configuration: {type(e).__name__}: {e}")
    dispatch.run("sharded_accept_greedy.arm", admission, lambda: _arm(worker), lambda: None)


def lm_head_hook(original, self, hidden_states, lm_head, logits_metadata, *args, **kwargs):
    """``LogitsProcessor._get_logits``: a target-verify forward of the armed processor runs
    with its gather skipped (:func:`gather_hook`)."""
    call = lambda: original(self, hidden_states, lm_head, logits_metadata, *args, **kwargs)
    deferred = deferral_of(self)
    if deferred is None:
        return call()
    if not logits_metadata.forward_mode.is_target_verify():
        admission = refuse("not a target-verify forward")
    elif logits_metadata.extend_return_logprob:
        admission = refuse("input logprobs read the logits")
    else:
        admission = admit("deferred")

    def deferring():
        token = in_deferred_forward.set(deferred)
        try:
            return call()
        finally:
            in_deferred_forward.reset(token)

    return dispatch.run("sharded_accept_greedy.lm_head", admission, deferring, call)


def gather_hook(original, self, x, *args, **kwargs):
    """``MultimemAllGatherer.__call__``: inside a deferred verify forward, the armed
    processor's gather returns its input, the shard; every other gather is SGLang's."""
    deferred = in_deferred_forward.get()
    if deferred is None or self is not deferred.processor._logits_gatherer:
        return original(self, x, *args, **kwargs)

    def keep_shard():
        deferred.shard_width, deferred.shard_dtype = x.shape[-1], x.dtype
        return x

    admission = admit("skipped", "the verify shard is kept: the accept gathers keys")
    return dispatch.run(
        "sharded_accept_greedy.gather",
        admission,
        keep_shard,
        lambda: original(self, x, *args, **kwargs),
    )


def verify_step_admission(batch) -> Admission:
    """Whether this verify step's greedy accept is the only reader of its logits (the batch's
    sampling state is the same on every TP rank)."""
    if batch.return_logprob:
        return refuse("logprobs asked")
    if batch.has_grammar:
        return refuse("a grammar masks the logits")
    info = batch.sampling_info
    if info is not None:
        if not info.is_all_greedy:
            return refuse("temperature > 0: a sampled accept")
        if not verify_logits_adjustments_are_noop(info):
            return refuse("logit adjustments (penalties, bias, custom processor)")
        if info.sampling_mask_batch_indices is not None:
            return refuse("sampling masks asked")
    return admit("kept", "greedy accept only: the shard is kept")


def finish_hook(original, self, *args, **kwargs):
    """``TargetVerifyExecutor._forward_prepared_verify``: after the verify forward, a step
    that is not greedy-only gets the gathered logits back."""
    result = original(self, *args, **kwargs)
    output = result.logits_output
    deferred = deferred_shard(getattr(output, "next_token_logits", None))
    if deferred is None:
        return result

    def gather():
        output.next_token_logits = deferred.gather(output.next_token_logits)

    admission = verify_step_admission(kwargs["batch"])
    dispatch.run("sharded_accept_greedy.finish", admission, lambda: None, gather)
    return result


HOOKS = (
    (f"{_WORKER}.__init__", arm_hook, HookType.AFTER),
    (f"{_LOGITS}._get_logits", lm_head_hook, HookType.AROUND),
    (f"{_GATHERER}.__call__", gather_hook, HookType.AROUND),
    (f"{_EXECUTOR}._forward_prepared_verify", finish_hook, HookType.AROUND),
)
REQUIRES = (
    f"{_LOGITS}._copy_logits_to_buffer",
    "sglang.srt.distributed.parallel_state.get_tp_group",
    "sglang.srt.speculative.dspark_components.dspark_verify.DsparkVerifyEpilogue._accept",
)
