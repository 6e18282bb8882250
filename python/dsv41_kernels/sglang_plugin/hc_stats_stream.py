"""Call site ``hc_stats_stream``: SGLang's own stats stream for the mHC statistics of a verify
step on Hopper.

``sglang.srt.models.deepseek_v4_mhc.use_stats_stream(cfg, forward_batch, x)`` decides whether a
layer hands its posts SGLang's stats stream (``hc_stats_stream``): each sublayer's layer forks
it before the combine, the post computes the statistics of the sublayer's input residual on it,
beside the sublayer, and joins it before reading them. SGLang 0.5.23 gives the stream to every
decode and verify step on Blackwell, but on SM90 only to one row or a decode of up to 64 rows:
a DSpark verify step (6 rows a request) runs its 80 statistics inline, on the critical path.

Where SGLang says no to a target-verify step on SM90 of a V4.1 layer (statistics lagged,
``pre_from_prev``), the hook says yes, when the GPU's policy gives the site the rows. The
boundary's critical path is then the post and the combine + RMSNorm, one launch where the
``hc_boundary`` switch is on (:func:`dsv41_kernels.hc_post_combine_norm`); our ``hc_mix_stats``
computes the statistics on the stream, with the bits it has inline. What it saves depends on
the sublayer beside which the statistics run, so the site is measured by
``benchmark/kernels/bench_hc_post_combine_norm.py --overlap`` (a cycle's boundaries with
sublayer stand-ins) and not by a call-site record: no policy gives it rows yet, and it declines
unless forced. It also declines where the boundary without statistics would not take the posts
(the ``hc_boundary`` switch off, its hook off after an error, or the policy declining site
``hc_post_combine_norm``): the stream would then displace the fused boundary for two launches.
So it is forced with that form: ``DSV41_KERNELS_FORCE=hc_stats_stream,hc_boundary``. Where
SGLang says yes the hook does not count the call; a layer without the stream (the DSpark draft
on SM90, ``SGLANG_OPT_USE_MULTI_STREAM_OVERLAP`` off) gets none either way, though the hook
counts its yes.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType
from sglang.srt.runtime_context import get_platform

from dsv41_kernels.admission import Admission, admit, refuse
from dsv41_kernels.sglang_plugin import dispatch, parts
from dsv41_kernels.sglang_plugin.policy import policy_refusal

_TARGET = "sglang.srt.models.deepseek_v4_mhc.use_stats_stream"
HOOK = "hc_stats_stream.use_stats_stream"
BOUNDARY = {"hc_post_combine_norm": "hc_post_combine_norm._post_fusion"}
"""The boundary form the stream relies on: without it the posts would be SGLang's post and our
combine, two launches in place of the fused boundary the stream displaces."""


def stats_stream_admission(cfg, forward_batch, x) -> Admission:
    """Whether a verify step SGLang runs inline takes the stream (pure: the step's mode, the
    layer's configuration, the platform, the rows)."""
    if not cfg.pre_from_prev:
        return refuse("the statistics are not lagged (pre_from_prev off)")
    if not forward_batch.forward_mode.is_target_verify():
        return refuse("not a target-verify step")
    if x.shape[0] == 0:
        return refuse("no rows")
    if not get_platform().is_sm90:
        return refuse("not SM90: SGLang's own rule stands")
    boundary = parts.parts_refusal(BOUNDARY, x)
    if boundary is not None:
        return boundary
    slower = policy_refusal("hc_stats_stream", x)
    if slower is not None:
        return slower
    return admit("stats stream", f"{x.shape[0]} verify rows: the statistics beside the sublayer")


def use_stats_stream_hook(original, cfg, forward_batch, x):
    if original(cfg, forward_batch, x):
        return True
    admission = stats_stream_admission(cfg, forward_batch, x)
    return dispatch.run(HOOK, admission, lambda: True, lambda: False)


HOOKS = ((_TARGET, use_stats_stream_hook, HookType.AROUND),)
REQUIRES = ("sglang.srt.models.deepseek_v4_mhc.fork_stats_stream",)
