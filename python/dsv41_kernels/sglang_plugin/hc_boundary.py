"""Call site ``hc_boundary``: the mHC boundary (post, next statistics, next combine + RMSNorm)
-> :func:`dsv41_kernels.hc_boundary`.

``sglang.srt.models.deepseek_v4_mhc._post_fusion(hc, y, residual, coefficients, next)`` runs a
hyper-connection's post. It is called from the next sublayer's read
(``HcReadCall.update_and_read``), and ``next`` (an ``HcNextBoundary``) names the consumer's
``HcSubLayer`` and norm whenever the seam is open (not after the last layer, not into an
Engram layer). On Blackwell SGLang folds the next statistics and combine into the post there
(``mhc_mega_boundary``, opt-in) and returns ``HcState(updated, pre, HcNormed(normed), stats)``:
the consumer's ``combine`` then returns ``normed`` as it is, and the next post takes ``stats``
as precomputed, so the statistics and the combine never run on their own. On Hopper SGLang
runs the plain post and leaves both to their own launches. Ours returns the same state from
one launch, on any GPU the op admits and the policy measured.

Where SGLang runs the next statistics on its stats stream beside the sublayer
(``use_stats_stream``: decode-like steps, on SM90 one row or a decode of up to 64, on Blackwell
every decode and verify), they are off its critical path, and a fused boundary would put them
back on it: the hook declines there. ``run_attn_post`` and ``run_moe_post`` are hooked only to
say, for the post they run, whether SGLang gave them that stream.

It declines (SGLang's ``_post_fusion`` runs) where SGLang overlaps the statistics (above),
where the seam is closed (no ``next``) or SGLang fuses it itself (its mega boundary), for a
norm SGLang calls not fusable, for a consumer that wants a pre-quantized input
(``HcQuantized``), in batch-invariant mode (the small-row statistics are not
batch-invariant), with ``hc_mix_stats`` or ``hc_combine_norm`` switched off (their bits are
the ones this hook produces), or where the op's admission refuses (more than 64 rows, fewer
than 128 SMs, ...).

Bits: ``updated`` is SGLang's post bit for bit; the statistics and ``normed`` are the bits our
``hc_mix_stats`` and ``hc_combine_norm`` hooks produce for the same rows.
"""

from __future__ import annotations

import contextvars
import os

from sglang.srt.batch_invariant_ops import is_batch_invariant_mode_enabled
from sglang.srt.models import deepseek_v4_mhc as mhc
from sglang.srt.plugins.hook_registry import HookType

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.ops.mhc.hc_boundary import hc_boundary, hc_boundary_admission
from dsv41_kernels.sglang_plugin import dispatch
from dsv41_kernels.sglang_plugin.policy import policy_refusal
from dsv41_kernels.sglang_plugin.switches import DISABLE_ENV, switch_names

_TARGET = "sglang.srt.models.deepseek_v4_mhc._post_fusion"
PARTS = ("hc_mix_stats", "hc_combine_norm")
"""The switches whose ops' bits the boundary produces: off when either is off."""
OVERLAPPED = "SGLang runs the statistics on its stats stream beside the sublayer here"

# Whether the post now running was given SGLang's stats stream (set around run_*_post).
_stats_beside_sublayer = contextvars.ContextVar("dsv41_stats_beside_sublayer", default=False)


def run_post_hook(original, *args, **kwargs):
    """AROUND ``run_attn_post`` / ``run_moe_post``: SGLang's function, with the post it runs told
    whether SGLang overlaps the statistics (a ``stats_stream`` given)."""
    token = _stats_beside_sublayer.set(kwargs.get("stats_stream") is not None)
    try:
        return original(*args, **kwargs)
    finally:
        _stats_beside_sublayer.reset(token)


def boundary_admission(hc, y, residual, coefficients, next) -> Admission:
    """Ours for this post, or SGLang's (pure: module flags, shapes, dtypes)."""
    if next is None or next.hc is None:
        return refuse("the seam is closed (last layer or Engram): no next sublayer")
    if _stats_beside_sublayer.get():
        return refuse(OVERLAPPED)
    if not next.norm_fusable:
        return refuse("SGLang calls the next norm not fusable")
    if next.accepts_mxfp8 or next.accepts_mxfp8_deepgemm or next.mega_moe_input is not None:
        return refuse("the next sublayer takes a pre-quantized input")
    if mhc._can_use_mega_mhc(hc.cfg):
        return refuse("SGLang's own mega boundary is on")
    if is_batch_invariant_mode_enabled():
        return refuse("batch-invariant mode")
    off = switch_names(os.environ.get(DISABLE_ENV, "")) & {*PARTS, "all"}
    if off:
        return refuse(f"{', '.join(sorted(off))} switched off ({DISABLE_ENV})")
    cfg, next_cfg = hc.cfg, next.hc.cfg
    if not (cfg.pre_from_prev and cfg.mult == 4 and next_cfg.mult == 4):
        return refuse("not V4.1's four streams with pre from the previous sublayer")
    norm = next.norm
    if norm.cast_x_before_out_mul or norm.variance_size_override is not None:
        return refuse("RMSNorm variant our kernel does not compute")
    slower = policy_refusal("hc_boundary", y)
    if slower is not None:
        return slower
    pre, post, comb = coefficients
    return hc_boundary_admission(
        y, residual, post, comb, pre, next.hc.fn, next.hc.scale, next.hc.base, norm.weight
    )


def post_fusion_hook(original, hc, y, residual, coefficients, next):
    admission = boundary_admission(hc, y, residual, coefficients, next)
    return dispatch.run(
        "hc_boundary._post_fusion",
        admission,
        lambda: _boundary(hc, y, residual, coefficients, next, admission),
        lambda: original(hc, y, residual, coefficients, next),
        replicated=True,  # the streams, gates and normed rows every rank holds a copy of
    )


def _boundary(hc, y, residual, coefficients, next, admission):
    pre, post, comb = coefficients
    next_hc = next.hc
    cfg = next_hc.cfg
    updated, normed, stats = hc_boundary(
        y, residual, post, comb, pre, next_hc.fn, next_hc.scale, next_hc.base, next.norm.weight,
        iters=cfg.sinkhorn_iters, rms_eps=cfg.rms_eps, eps=cfg.eps,
        post_mult=mhc.MHC_POST_MULT_VALUE, norm_eps=next.norm.variance_epsilon,
        admission=admission,
    )  # fmt: skip
    # `pre` stays this boundary's: SGLang's lag (the last combine and Engram layers read it).
    return mhc.HcState(updated, pre, mhc.HcNormed(normed), stats)


HOOKS = (
    (_TARGET, post_fusion_hook, HookType.AROUND),
    ("sglang.srt.models.deepseek_v4_mhc.run_attn_post", run_post_hook, HookType.AROUND),
    ("sglang.srt.models.deepseek_v4_mhc.run_moe_post", run_post_hook, HookType.AROUND),
)
REQUIRES = (
    "sglang.srt.models.deepseek_v4_mhc.HcNormed",
    "sglang.srt.models.deepseek_v4_mhc._can_use_mega_mhc",
    "sglang.srt.models.deepseek_v4_mhc.MHC_POST_MULT_VALUE",
)
