"""Call site ``hc_mix_stats``: the mHC mixing statistics -> :func:`dsv41_kernels.hc_mix_stats`.

``sglang.srt.models.deepseek_v4_mhc._mix_stats_impl(hc, x)`` predicts ``(pre, post, comb)``
from the four residual streams of every hyper-connection. Ours takes the small-row path below
128 rows (decode and verify), the compensated two-pass TF32 path from 128 rows (prefill), and
the batch-invariant path whenever SGLang's batch-invariant mode is on.

The compensated path reads each sublayer's weight and its TF32 residual ``lo`` (``hi`` is read
from the weight itself), built once at load: an
AFTER hook on ``DeepseekV4DecoderLayerBase.refresh_mhc_norm_weight_cache`` (SGLang's post-load
step, re-run after weight updates) builds an ``HcDerivedWeights`` per mixing weight and keeps
them on the layer (``_hc_derived_weights``). While one is active the layer carries its refusal
as ``_derived_weight_cache_error``, the attribute SGLang's weight updater checks before writing
anything, so online weight updates are refused with that message (restart with
``DSV41_KERNELS_DISABLE=hc_mix_stats`` to update weights online); releasing a holder republishes.
"""

from __future__ import annotations

import torch
from sglang.srt.batch_invariant_ops import is_batch_invariant_mode_enabled
from sglang.srt.models.deepseek_v4_mhc import MHC_POST_MULT_VALUE
from sglang.srt.plugins.hook_registry import HookType

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.ops.mhc.hc_derived_weights import HcDerivedWeights
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats, hc_mix_stats_admission
from dsv41_kernels.sglang_plugin import dispatch
from dsv41_kernels.sglang_plugin.policy import policy_refusal

_LAYER = "sglang.srt.models.deepseek_v4.DeepseekV4DecoderLayerBase"
MIXING_WEIGHTS = ("hc_attn_fn", "hc_ffn_fn")
RESTART_HINT = "restart with DSV41_KERNELS_DISABLE=hc_mix_stats to use online weight updates"

# id(fn) -> its residual's holder; the holder keeps fn alive, and lookups check identity.
_derived: dict[int, HcDerivedWeights] = {}


def derived_weights(fn: torch.Tensor):
    """The active holder built at load for ``fn``, or None."""
    holder = _derived.get(id(fn))
    return holder if holder is not None and holder.fn is fn and holder.active else None


def build_derived_weights(_result, layer) -> None:
    """AFTER ``refresh_mhc_norm_weight_cache``: (re)build this layer's residuals."""
    for holder in getattr(layer, "_hc_derived_weights", ()):
        _derived.pop(id(holder.fn), None)
        holder.release()
    layer._hc_derived_weights = []
    if not getattr(layer, "hc_pre_from_prev_sublayer", False) or is_batch_invariant_mode_enabled():
        return  # no HcSubLayer to serve, or the invariant path (which takes fn as it is)
    for name in MIXING_WEIGHTS:
        fn = getattr(layer, name, None)
        if isinstance(fn, torch.Tensor) and fn.dtype == torch.float32 and fn.dim() == 2:
            label = f"layer {getattr(layer, 'layer_id', '?')} {name}; {RESTART_HINT}"
            holder = HcDerivedWeights(fn, name=label, on_release=lambda: publish_refusal(layer))
            layer._hc_derived_weights.append(holder)
            _derived[id(fn)] = holder
    publish_refusal(layer)


def publish_refusal(layer) -> None:
    """Set ``layer._derived_weight_cache_error`` to its first active holder's refusal, or None:
    SGLang's weight updater refuses an update while it is set."""
    holders = getattr(layer, "_hc_derived_weights", ())
    reasons = [h.update_refusal() for h in holders if h.active]
    layer._derived_weight_cache_error = reasons[0] if reasons else None


def mix_stats_admission(hc, x: torch.Tensor, weights, mode: str) -> Admission:
    """Ours for this call, or SGLang's (pure: shapes, dtypes, devices)."""
    if hc.cfg.mult != 4 or x.dim() != 3 or x.shape[1] != 4:
        return refuse("not four residual streams")
    if hc.fn.dtype != torch.float32 or tuple(hc.fn.shape) != (24, 4 * x.shape[2]):
        return refuse("mixing weight is not fp32 [24, 4H]")
    if hc.scale.dtype != torch.float32 or hc.base.dtype != torch.float32:
        return refuse("scale or base not fp32")
    slower = policy_refusal("hc_mix_stats", x)
    if slower is not None:
        return slower
    return hc_mix_stats_admission(x, weights, mode)


def mix_stats_hook(original, hc, x):
    mode = "batch_invariant" if is_batch_invariant_mode_enabled() else "auto"
    weights = derived_weights(hc.fn) or hc.fn
    admission = mix_stats_admission(hc, x, weights, mode)
    cfg = hc.cfg
    return dispatch.run(
        "hc_mix_stats._mix_stats_impl",
        admission,
        lambda: hc_mix_stats(
            x,
            weights,
            hc.scale,
            hc.base,
            iters=cfg.sinkhorn_iters,
            rms_eps=cfg.rms_eps,
            eps=cfg.eps,
            post_mult=MHC_POST_MULT_VALUE,
            mode=mode,
            admission=admission,
        ),
        lambda: original(hc, x),
        replicated=True,  # the gates feed the residual streams every rank holds a copy of
    )


HOOKS = (
    ("sglang.srt.models.deepseek_v4_mhc._mix_stats_impl", mix_stats_hook, HookType.AROUND),
    (f"{_LAYER}.refresh_mhc_norm_weight_cache", build_derived_weights, HookType.AFTER),
)
REQUIRES = (
    "sglang.srt.model_executor.model_runner_components.weight_updater."
    "_unsupported_derived_weight_cache_error",
)
