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
back on it. There the hook takes the boundary without them instead
(:func:`dsv41_kernels.hc_post_combine_norm`: the post and the next combine + RMSNorm in one
launch, counted as ``hc_post_combine_norm._post_fusion``, its own policy site) and returns
``HcState(updated, pre, HcNormed(normed))``: the next post computes its statistics on the
stream as SGLang does. ``run_attn_post`` and ``run_moe_post`` are hooked (:mod:`.posts`) only
to say, for the post they run, whether SGLang gave them that stream.

Both forms decline (SGLang's ``_post_fusion`` runs) where the seam is closed (no ``next``) or
SGLang fuses it itself (its mega boundary), where SGLang's post is not the split-H fma chain
(``SGLANG_OPT_USE_FLASHINFER_MHC`` on, or the TileLang post off, on SM90; above 384 rows:
:func:`sglang_post_is_split_h`), for a norm SGLang
calls not fusable, for a consumer that wants a pre-quantized input (``HcQuantized``), wherever
our ``hc_combine_norm`` would not run at an unfused seam (switched off, not installed, off
after an error, or declined by the GPU's policy: both forms produce its bits), or where the
op's admission or the GPU's policy refuses. The fused boundary also declines in
batch-invariant mode (the small-row statistics are not batch-invariant) and wherever our
``hc_mix_stats`` would not run, and beyond 64 rows or below 128 SMs. Launched as its
cooperative grid, it would wait for all 128 of its CTAs to find SMs (a kernel holding SMs on
another stream delays it); its dependent pair (not yet the plan's launch anywhere) would not.

Bits: ``updated`` is SGLang's post bit for bit; the statistics and ``normed`` are the bits our
``hc_mix_stats`` and ``hc_combine_norm`` hooks produce for the same rows (both forms).

The next sublayer's FP8 input (site ``hc_boundary_quant_fp8``, under this switch). On SM90 the
block-FP8 linear that reads ``normed`` first (the attention's ``wqkv_a``, the FFN's
shared-expert ``gate_up_proj``; V4.1's ``[32, 32]`` ue8m0 checkpoint) quantizes it in a launch
of its own:
``deepgemm_w8a8_block_fp8_linear_with_fallback`` calls ``sglang_per_token_group_quant_fp8(x,
32, scale_ue8m0=True)``. SGLang's seam for a pre-quantized input (``HcQuantized``) is
Blackwell's: on SM90 ``HcReadCall.read`` drops the pair, since its attention does not take
MXFP8. Where the policy measured it faster, the fused boundary writes those groups in the same
launch and pins them to ``normed`` (:mod:`.group_quant`); the quantizer call of a linear that
reads exactly these unmodified rows with exactly that quantization returns them: SGLang's
quantizer's bits by the op's contract, so the GEMM gets the operands it would have had. The
boundary without statistics does the same under its own site (``hc_post_combine_norm_quant_fp8``:
on SM90 one row or a decode of up to 64, and verify steps the ``hc_stats_stream`` site gives the
stream).
"""

from __future__ import annotations

from sglang.srt.batch_invariant_ops import is_batch_invariant_mode_enabled
from sglang.srt.environ import envs
from sglang.srt.models import deepseek_v4_mhc as mhc
from sglang.srt.plugins.hook_registry import HookType
from sglang.srt.runtime_context import get_platform

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.ops.mhc.hc_boundary import hc_boundary, hc_boundary_admission
from dsv41_kernels.ops.mhc.hc_post_combine_norm import (
    hc_post_combine_norm,
    hc_post_combine_norm_admission,
)
from dsv41_kernels.sglang_plugin import dispatch, group_quant, parts, posts
from dsv41_kernels.sglang_plugin.policy import policy_refusal

_TARGET = "sglang.srt.models.deepseek_v4_mhc._post_fusion"
PART_HOOKS = {
    "hc_mix_stats": "hc_mix_stats._mix_stats_impl",
    "hc_combine_norm": "hc_combine_norm._combine",
}
"""The switches whose ops' bits the boundary produces, and their hooks: off when either is."""
COMBINE_PART = {"hc_combine_norm": PART_HOOKS["hc_combine_norm"]}
"""The part of the boundary without its statistics (hc_post_combine_norm)."""
HOOK = "hc_boundary._post_fusion"
POST_COMBINE_NORM_HOOK = "hc_post_combine_norm._post_fusion"
QUANT_SITE = "hc_boundary_quant_fp8"
POST_QUANT_SITE = "hc_post_combine_norm_quant_fp8"


def seam_refusal(hc, residual, next) -> Admission | None:
    """The refusal both forms share, or None (pure: module flags, the layer's configuration)."""
    if next is None or next.hc is None:
        return refuse("the seam is closed (last layer or Engram): no next sublayer")
    if not next.norm_fusable:
        return refuse("SGLang calls the next norm not fusable")
    if next.accepts_mxfp8 or next.accepts_mxfp8_deepgemm or next.mega_moe_input is not None:
        return refuse("the next sublayer takes a pre-quantized input")
    if mhc._can_use_mega_mhc(hc.cfg):
        return refuse("SGLang's own mega boundary is on")
    cfg, next_cfg = hc.cfg, next.hc.cfg
    if not (cfg.pre_from_prev and cfg.mult == 4 and next_cfg.mult == 4):
        return refuse("not V4.1's four streams with pre from the previous sublayer")
    if not sglang_post_is_split_h(cfg, residual.shape[0]):
        return refuse("SGLang's post here is not the split-H fma chain ours reproduces")
    norm = next.norm
    if norm is not next.hc.norm:
        return refuse("the boundary's norm is not the next sublayer's")
    if norm.cast_x_before_out_mul or norm.variance_size_override is not None:
        return refuse("RMSNorm variant our kernel does not compute")
    return None


def boundary_admission(hc, y, residual, coefficients, next) -> Admission:
    """Ours for this post with the next statistics inline, or SGLang's (pure: module flags,
    shapes, dtypes)."""
    shared = seam_refusal(hc, residual, next)
    if shared is not None:
        return shared
    if is_batch_invariant_mode_enabled():
        return refuse("batch-invariant mode")
    missing = parts_refusal(residual)
    if missing is not None:
        return missing
    slower = policy_refusal("hc_boundary", y)
    if slower is not None:
        return slower
    pre, post, comb = coefficients
    next_hc = next.hc
    return hc_boundary_admission(
        y, residual, post, comb, pre, next_hc.fn, next_hc.scale, next_hc.base, next.norm.weight
    )


def post_combine_norm_admission(hc, y, residual, coefficients, next) -> Admission:
    """Ours for this post with the next statistics beside the sublayer (SGLang's stats stream),
    or SGLang's (pure)."""
    shared = seam_refusal(hc, residual, next)
    if shared is not None:
        return shared
    part = parts.parts_refusal(COMBINE_PART, residual)
    if part is not None:
        return part
    slower = policy_refusal("hc_post_combine_norm", y)
    if slower is not None:
        return slower
    pre, post, comb = coefficients
    return hc_post_combine_norm_admission(y, residual, post, comb, pre, next.norm.weight)


SPLIT_H_MAX_ROWS = 384
"""The rows up to which SGLang 0.5.23's ``post`` has the split-H bits: on Blackwell
``mhc_post_split_h`` (its tile limit; above, another kernel rounds it); on SM90 the split-H
kernel to 64 rows and the TileLang ``mhc_post`` above, whose bits a GPU test holds to be the
same at 65-384 rows (``test_gpu_sglangs_tilelang_post_above_64_rows``)."""


def sglang_post_is_split_h(cfg, rows: int) -> bool:
    """Whether SGLang 0.5.23's ``post`` runs ``mhc_post_split_h`` for V4.1's streams at ``rows``
    rows (or the TileLang post with its bits), as ``deepseek_v4_mhc.post`` picks: Blackwell
    first, up to 384 rows; elsewhere only on SM90 with the TileLang post on and FlashInfer's off
    (their defaults), up to 384 rows (:data:`SPLIT_H_MAX_ROWS`).
    Otherwise SGLang rounds another way and ours would change its bits."""
    v41 = cfg.pre_from_prev and cfg.mult == 4 and cfg.hidden == 5120
    if not (v41 and 0 < rows <= SPLIT_H_MAX_ROWS):
        return False
    platform = get_platform()
    if platform.is_blackwell:
        return True
    tilelang = envs.SGLANG_OPT_USE_TILELANG_MHC_POST.get()
    return platform.is_sm90 and tilelang and not envs.SGLANG_OPT_USE_FLASHINFER_MHC.get()


def parts_refusal(rows) -> Admission | None:
    """The refusal when our statistics or combine would not be what runs at an unfused seam
    (the fused boundary produces their bits, and seams it declines run theirs)."""
    return parts.parts_refusal(PART_HOOKS, rows)


def post_fusion_hook(original, hc, y, residual, coefficients, next):
    sglang = lambda: original(hc, y, residual, coefficients, next)
    if posts.stats_beside_sublayer():
        admission = post_combine_norm_admission(hc, y, residual, coefficients, next)
        ours = lambda: _post_combine_norm(y, residual, coefficients, next, admission)
        return dispatch.run(POST_COMBINE_NORM_HOOK, admission, ours, sglang, replicated=True)
    admission = boundary_admission(hc, y, residual, coefficients, next)
    return dispatch.run(
        HOOK,
        admission,
        lambda: _boundary(hc, y, residual, coefficients, next, admission),
        sglang,
        replicated=True,  # the streams, gates and normed rows every rank holds a copy of
    )


def _boundary(hc, y, residual, coefficients, next, admission):
    pre, post, comb = coefficients
    next_hc = next.hc
    cfg = next_hc.cfg
    quant_out = group_quant.quant_out_for(y, y.shape[1], QUANT_SITE)
    updated, normed, stats = hc_boundary(
        y, residual, post, comb, pre, next_hc.fn, next_hc.scale, next_hc.base, next.norm.weight,
        iters=cfg.sinkhorn_iters, rms_eps=cfg.rms_eps, eps=cfg.eps,
        post_mult=mhc.MHC_POST_MULT_VALUE, norm_eps=next.norm.variance_epsilon,
        admission=admission, quant_out=quant_out,
    )  # fmt: skip
    group_quant.pin(normed, quant_out, QUANT_SITE)
    # `pre` stays this boundary's: SGLang's lag (the last combine and Engram layers read it).
    return mhc.HcState(updated, pre, mhc.HcNormed(normed), stats)


def _post_combine_norm(y, residual, coefficients, next, admission):
    pre, post, comb = coefficients
    quant_out = group_quant.quant_out_for(y, y.shape[1], POST_QUANT_SITE)
    updated, normed = hc_post_combine_norm(
        y, residual, post, comb, pre, next.norm.weight, next.norm.variance_epsilon,
        admission=admission, quant_out=quant_out,
    )  # fmt: skip
    group_quant.pin(normed, quant_out, POST_QUANT_SITE)
    # No statistics: the next post computes them on SGLang's stats stream, as it would.
    return mhc.HcState(updated, pre, mhc.HcNormed(normed))


HOOKS = ((_TARGET, post_fusion_hook, HookType.AROUND), *posts.HOOKS, group_quant.HOOK)
REQUIRES = (
    "sglang.srt.models.deepseek_v4_mhc.HcNormed",
    "sglang.srt.models.deepseek_v4_mhc._can_use_mega_mhc",
    "sglang.srt.models.deepseek_v4_mhc.MHC_POST_MULT_VALUE",
)
