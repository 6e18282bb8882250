"""Call site ``accept_greedy_epilogue``: DSpark's static verify epilogue ->
:func:`dsv41_kernels.ops.speculative.accept_greedy_epilogue.accept_greedy_epilogue`.

SGLang 0.5.23 records the epilogue into the target's verify CUDA graph: ``_static_epilogue`` ->
``run_static`` -> ``DsparkVerifyEpilogue._accept_static_greedy(self, io, *, verify_lens, gate,
gated)``, looked up on the instance at each call. By default that runs the greedy accept, then
``build_accept_outs`` (``FinalizeAcceptLens``, ``BuildOutTokens``, six copies into the static
buffers ``read_accept(bs)``) and the gated commit lengths: 14 launches with our accept hook,
17 with SGLang's. Ours writes the same buffers and the gated lengths (into SGLang's
``gated_commit_lens_buf``, as its fused tail does) in the accept's one launch, bitwise SGLang's
outputs over ``torch.argmax``.

Under the accept-site TP broadcast (``SGLANG_SPEC_TP_SYNC`` holds ``dspark-accept-graph``, the
default at TP > 1) rank 0's accept must replace every rank's before the tail reads it: ours is
then two launches around SGLang's own three broadcasts, made in its order and dtypes, so the
collectives match whichever path each rank takes.

Declined, with the reason counted (the accept then runs in SGLang's steps, where the
``accept_greedy`` hook still takes it):
- SGLang's fused accept tail serves the batch (``SGLANG_DSPARK_FUSED_ACCEPT_TAIL=1``);
- a simulated accept length (``SGLANG_SIMULATE_ACC_LEN``), or the block accept lengths buffer
  (``SGLANG_OPT_DSV41_POST_FORWARD_CUDA_GRAPH``);
- verify logits left as this rank's vocab shard (call site ``sharded_accept_greedy``);
- where our accept would not run in SGLang's steps (``accept_greedy`` switched off, off after
  an error, or declined by the policy): the epilogue computes its bits;
- the policy, and the op's admission.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType
from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.ops.speculative.accept_greedy_epilogue import (
    EpilogueOuts,
    accept_greedy_epilogue,
    accept_greedy_epilogue_admission,
)
from dsv41_kernels.sglang_plugin import deferred_verify, dispatch
from dsv41_kernels.sglang_plugin.parts import parts_refusal
from dsv41_kernels.sglang_plugin.policy import policy_refusal

_CLASS = "sglang.srt.speculative.dspark_components.dspark_verify.DsparkVerifyEpilogue"
HOOK = "accept_greedy_epilogue._accept_static_greedy"
PART_HOOKS = {"accept_greedy": "accept_greedy.accept_greedy_triton"}
"""The switch whose op's bits the epilogue produces (its accept), and its hook: where our
accept would not run in SGLang's steps, neither does the epilogue."""


def sglang_state_refusal(epilogue, io) -> Admission | None:
    """Why SGLang's own steps must run for this epilogue's state, or None."""
    bs = io.candidates.shape[0]
    if epilogue._serves_accept_tail(bs):
        return refuse("SGLang's fused accept tail serves it (SGLANG_DSPARK_FUSED_ACCEPT_TAIL)")
    if epilogue.simulated_correct_len is not None or epilogue.simulate_fold:
        return refuse("simulated accept length (SGLANG_SIMULATE_ACC_LEN)")
    if epilogue.read_block_accept_lens(bs) is not None:
        return refuse("block accept lengths buffer (SGLANG_OPT_DSV41_POST_FORWARD_CUDA_GRAPH)")
    if deferred_verify.deferred_shard(io.logits) is not None:
        return refuse("verify logits left sharded (call site sharded_accept_greedy)")
    if io.candidates.shape[1] != epilogue.stride:
        return refuse("candidates' rows != the epilogue's verify rows")
    return None


def accept_site_broadcast(epilogue):
    """SGLang's accept-site TP broadcast of this epilogue (rank 0's values, in place), or None
    where it is off (one rank, or ``SGLANG_SPEC_TP_SYNC`` without ``dspark-accept-graph``)."""
    tp_sync, site = epilogue._tp_sync, SpecTpSyncSite.DSPARK_ACCEPT_GRAPH
    return (lambda values: tp_sync.sync(site, values)) if tp_sync.enabled(site) else None


def outputs(epilogue, bs: int, gated: bool) -> EpilogueOuts:
    """SGLang's static buffers for ``bs`` requests (and its gated lengths' buffer)."""
    buffers = epilogue.read_accept(bs)
    return EpilogueOuts(
        buffers.correct_len,
        buffers.bonus,
        buffers.cap_trim_lens,
        buffers.commit_lens,
        buffers.new_seq_lens,
        buffers.out_tokens,
        epilogue.gated_commit_lens_buf[:bs] if gated else None,
    )


def epilogue_hook(original, self, io, *, verify_lens, gate, gated):
    out = None
    admission = sglang_state_refusal(self, io)
    if admission is None:  # a refusal is falsy: test for None, never for truth
        admission = parts_refusal(PART_HOOKS, io.logits)
    if admission is None:
        admission = policy_refusal("accept_greedy_epilogue", io.logits)
    if admission is None:
        bs = io.candidates.shape[0]
        out = outputs(self, bs, gated)
        arguments = (io.candidates, io.logits, io.seq_lens[:bs])
        if gated:
            arguments += (verify_lens, gate)
        admission = accept_greedy_epilogue_admission(*arguments, out=out)

    def ours():
        accept_greedy_epilogue(
            *arguments, out=out, broadcast=accept_site_broadcast(self), admission=admission
        )
        return out.gated

    return dispatch.run(
        HOOK,
        admission,
        ours,
        lambda: original(self, io, verify_lens=verify_lens, gate=gate, gated=gated),
        # At TP > 1 without the broadcast every rank commits its own accept: one rank falling
        # back to SGLang's argmax alone could commit other tokens than the rest.
        replicated=True,
    )


HOOKS = ((f"{_CLASS}._accept_static_greedy", epilogue_hook, HookType.AROUND),)
REQUIRES = (
    f"{_CLASS}.read_accept",
    f"{_CLASS}._serves_accept_tail",
    f"{_CLASS}.read_block_accept_lens",
)
