"""SGLang's FP8 per-token-group quantizer (``sglang_per_token_group_quant_fp8``), answered with
a result one of our launches already made.

Three call sites compute, in a launch of their own op, the quantization SGLang runs next:
- ``inverse_rope_quant_fp8`` quantizes the attention output with its inverse RoPE; the
  quantizer call that follows in ``MQALayer.forward`` takes that result (:func:`keep_for_next`,
  one call);
- ``hc_boundary`` (either form: with the statistics, or without them where they run on the
  stats stream) and ``hc_combine_norm`` (at a seam the boundary left unfused) quantize the next
  sublayer's normed input in their launch and pin the pair to those rows until the next post
  (:func:`pin`, where :func:`groups_admission` admits; :mod:`.posts` unpins); an FP8 linear
  that reads them (on SM90 the attention's ``wqkv_a`` and the shared expert's
  ``gate_up_proj``: ``deepgemm_w8a8_block_fp8_linear_with_fallback`` calls
  ``sglang_per_token_group_quant_fp8(x.view(-1, K), 32, scale_ue8m0=True)``) gets the pair
  instead of a launch, when its call asks for exactly that quantization of exactly those
  unmodified rows.

SGLang's registry rewrites every binding of the function (``deepseek_v4``'s, ``fp8_utils``'
for every FP8 linear, the kernel module's own), so one AROUND hook (:func:`quant_hook`) sees
every call; each call site lists it, and the plugin registers a hook once. A call no result
answers goes to SGLang's function, uncounted.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from sglang.kernels.ops.quantization import fp8_kernel
from sglang.kernels.ops.quantization.fp8_kernel import sglang_per_token_group_quant_fp8
from sglang.srt.plugins.hook_registry import HookType
from sglang.srt.runtime_context import get_platform

from dsv41_kernels.admission import Admission, admit, refuse
from dsv41_kernels.ops.mhc.quant_out import QUANT_GROUP, empty_quant_out
from dsv41_kernels.sglang_plugin import dispatch
from dsv41_kernels.sglang_plugin.policy import policy_refusal

TARGET = "sglang.srt.models.deepseek_v4.sglang_per_token_group_quant_fp8"
PINNED = "sglang_per_token_group_quant_fp8"
"""A quantizer call answered with pinned groups is counted as ``<site>.`` this, ``site`` the
policy site of the launch that made them (:func:`pin`)."""
_SIGNATURE = inspect.signature(sglang_per_token_group_quant_fp8)
AMAX_FLOOR = 1e-10
"""The quantizer's default ``eps``, the floor our kernels apply (fp8_kernel.py:492)."""


def differing(arguments: dict[str, Any], *, group_size: int, scale_ue8m0: bool) -> list[str]:
    """The arguments of a quantizer call (bound, defaulted) that differ from the plain call
    ``(x, group_size, scale_ue8m0=scale_ue8m0)``: row-major fp32 scales, the default floor, no
    fused SiLU, mask or output buffers."""
    expected = {
        "group_size": group_size,
        "eps": AMAX_FLOOR,
        "column_major_scales": False,
        "scale_tma_aligned": False,
        "scale_ue8m0": scale_ue8m0,
        "fuse_silu_and_mul": False,
        "masked_m": None,
        "output_q": None,
        "output_s": None,
    }
    return [name for name, value in expected.items() if arguments[name] != value]


@dataclass
class Kept:
    """A result for a quantizer call: its fire-count name, the test of whether a call (its
    bound, defaulted arguments) is the one it answers, and the ``(q, scales)`` it returns."""

    hook: str
    serves: Callable[[dict[str, Any]], Admission]
    result: tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Pinned:
    """The e4m3 groups of the rows a launch of ours normed and their power-of-two scales, as
    SGLang's ``sglang_per_token_group_quant_fp8(rows, group, scale_ue8m0=True)`` returns them,
    the version counters of the rows, ``q`` and ``scales`` then (a torch in-place write since
    makes them stale), and the name a call they answer is counted under."""

    rows: weakref.ref
    q: torch.Tensor
    scales: torch.Tensor
    group: int
    versions: tuple[int, int, int]
    hook: str

    def serves(self, rows: torch.Tensor, arguments: dict[str, Any]) -> Admission:
        x = arguments["x"]
        if _versions(rows, self.q, self.scales) != self.versions:
            return refuse("the rows or our groups were written in place since our launch")
        if not (
            x.data_ptr() == rows.data_ptr() and x.shape == rows.shape
            and x.stride() == rows.stride() and x.dtype == rows.dtype
        ):  # fmt: skip
            return refuse(f"x is not the rows our launch quantized ({tuple(x.shape)})")
        differ = differing(arguments, group_size=self.group, scale_ue8m0=True)
        if differ:
            return refuse(f"another quantization of our rows ({', '.join(differ)})")
        return admit("pinned", "the groups our launch made of these rows")


@dataclass
class Slots:
    pending: Kept | None = None
    """The result the next quantizer call is offered (``inverse_rope_quant_fp8``'s)."""
    pinned: Pinned | None = None
    """The groups of the rows our latest launch normed, until the next post begins."""


_slots = Slots()


def keep_for_next(kept: Kept | None) -> None:
    """The result the next quantizer call is offered (None: no offer)."""
    _slots.pending = kept


def _versions(*tensors: torch.Tensor) -> tuple[int, ...]:
    return tuple(t._version for t in tensors)


def groups_admission(rows: torch.Tensor, site: str) -> Admission:
    """Whether a launch of policy ``site`` that norms ``rows`` for the next sublayer also writes
    their FP8 groups for its block-FP8 linear, to :func:`pin` (pure: the platform, SGLang's FP8
    dtype, torch's inference mode, the policy)."""
    if not get_platform().is_sm90:
        return refuse("not SM90: SGLang's FP8 linears quantize their bf16 input otherwise")
    if fp8_kernel.fp8_dtype != torch.float8_e4m3fn:
        return refuse(f"SGLang quantizes to {fp8_kernel.fp8_dtype} here")
    if torch.is_inference_mode_enabled() or rows.is_inference():
        return refuse("torch inference mode: its tensors keep no version counter to pin against")
    slower = policy_refusal(site, rows)
    if slower is not None:
        return slower
    return admit("pinned", f"e4m3 groups of {QUANT_GROUP} with power-of-two scales")


def quant_out_for(rows: torch.Tensor, width: int, site: str):
    """An empty ``quant_out`` for the normed rows of width ``width`` that a launch of policy
    ``site`` makes from ``rows`` (:func:`~dsv41_kernels.ops.mhc.quant_out.empty_quant_out`),
    where :func:`groups_admission` admits; else None."""
    if not groups_admission(rows, site):
        return None
    return empty_quant_out(rows.shape[0], width, rows.device)


def pin(rows: torch.Tensor, quant_out, site: str) -> None:
    """Pin ``quant_out`` ``(q, scales)``, the groups of :data:`QUANT_GROUP` columns of ``rows``
    (a tensor that is not a view, outside inference mode: its tensors keep no version counter)
    that a launch of policy ``site`` made, for the quantizer calls that read ``rows``, until
    :func:`unpin`; those calls are counted as ``<site>.sglang_per_token_group_quant_fp8``.
    None (no groups made) pins nothing."""
    if quant_out is None:
        return
    q, scales = quant_out
    versions = _versions(rows, q, scales)
    _slots.pinned = Pinned(weakref.ref(rows), q, scales, QUANT_GROUP, versions, f"{site}.{PINNED}")


def unpin() -> None:
    """Drop the pin: called when a sublayer has returned (its post begins), so that no later
    call is answered with groups of rows the sublayer may have rewritten with a kernel, which
    no version counter sees (SGLang's in-place Triton MoE writes its output into its input)."""
    _slots.pinned = None


def pinned_rows(x) -> tuple[torch.Tensor, Pinned] | None:
    """The pinned rows, when ``x`` is them or a view of them, and their groups; else None."""
    pinned = _slots.pinned
    rows = pinned.rows() if pinned is not None else None
    if rows is None or not isinstance(x, torch.Tensor) or not (x is rows or x._base is rows):
        return None
    return rows, pinned


def _kept(args, kwargs) -> Kept | None:
    if _slots.pending is not None:
        kept, _slots.pending = _slots.pending, None
        return kept
    found = pinned_rows(args[0] if args else kwargs.get("x"))
    if found is None:
        return None
    rows, groups = found
    return Kept(groups.hook, lambda arguments: groups.serves(rows, arguments),
                (groups.q, groups.scales))  # fmt: skip


def quant_hook(original, *args, **kwargs):
    kept = _kept(args, kwargs)
    if kept is None:
        return original(*args, **kwargs)
    call = _SIGNATURE.bind(*args, **kwargs)
    call.apply_defaults()
    return dispatch.run(
        kept.hook,
        kept.serves(call.arguments),
        lambda: kept.result,
        lambda: original(*args, **kwargs),
    )


HOOK = (TARGET, quant_hook, HookType.AROUND)
