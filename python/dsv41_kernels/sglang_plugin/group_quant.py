"""SGLang's FP8 per-token-group quantizer (``sglang_per_token_group_quant_fp8``), answered with
a result one of our launches already made.

Two call sites compute, in a launch of their own op, the quantization SGLang runs next:
- ``inverse_rope_quant_fp8`` quantizes the attention output with its inverse RoPE; the
  quantizer call that follows in ``MQALayer.forward`` takes that result (:func:`keep_for_next`,
  one call);
- ``hc_boundary`` quantizes the next sublayer's normed input in the boundary's launch and pins
  the pair to those rows (:func:`pin`); an FP8 linear that reads them (on SM90 the attention's
  ``wqkv_a`` and the shared expert's ``gate_up_proj``:
  ``deepgemm_w8a8_block_fp8_linear_with_fallback`` calls
  ``sglang_per_token_group_quant_fp8(x.view(-1, K), 32, scale_ue8m0=True)``) gets the pair
  instead of a launch, when its call asks for exactly that quantization of exactly those
  unmodified rows.

SGLang's registry rewrites every binding of the function (``deepseek_v4``'s, ``fp8_utils``'
for every FP8 linear, the kernel module's own), so one AROUND hook (:func:`quant_hook`) sees
every call; both call sites list it, and the plugin registers a hook once. A call neither
result answers goes to SGLang's function, uncounted.
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

from dsv41_kernels.admission import Admission, admit, refuse
from dsv41_kernels.sglang_plugin import dispatch

TARGET = "sglang.srt.models.deepseek_v4.sglang_per_token_group_quant_fp8"
PINNED_HOOK = "hc_boundary_quant_fp8.sglang_per_token_group_quant_fp8"
PIN = "_dsv41_kernels_fp8_groups"
"""The attribute of rows a launch of ours quantized: their :class:`Pinned` groups."""
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
    """The e4m3 groups of some rows and their power-of-two scales, as SGLang's
    ``sglang_per_token_group_quant_fp8(rows, group, scale_ue8m0=True)`` returns them, and the
    rows' version counter when they were made (a torch in-place write since makes them stale).
    A kernel's own write is not counted: with FP8 routed experts on its Triton runner SGLang
    writes the MoE output into the FFN's input rows in place, after its shared expert has
    quantized them (``forward_normal``), so the groups stay the rows' as that call saw them."""

    q: torch.Tensor
    scales: torch.Tensor
    group: int
    versions: tuple[int, int, int]  # of the rows, q and scales

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
        if fp8_kernel.fp8_dtype != torch.float8_e4m3fn:
            return refuse(f"SGLang quantizes to {fp8_kernel.fp8_dtype} here")
        return admit("pinned", "the groups the boundary's launch made of these rows")


_pending: list[Kept] = []


def keep_for_next(kept: Kept | None) -> None:
    """The result the next quantizer call is offered (None: no offer)."""
    _pending[:] = [] if kept is None else [kept]


def _versions(*tensors: torch.Tensor) -> tuple[int, ...]:
    return tuple(t._version for t in tensors)


_pinned: list[weakref.ref] = []


def pin(rows: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, group: int) -> None:
    """Pin ``(q, scales)``, the groups of ``group`` columns of ``rows`` (a tensor that is not a
    view, outside inference mode: its tensors keep no version counter), to ``rows`` for the
    quantizer calls that read them, until :func:`unpin_all`."""
    setattr(rows, PIN, Pinned(q, scales, group, _versions(rows, q, scales)))
    _pinned.append(weakref.ref(rows))


def unpin_all() -> None:
    """Drop every pin: called when a sublayer has returned (its post begins), so that no later
    call is answered with groups of rows the sublayer may have rewritten with a kernel, which
    no version counter sees (SGLang's in-place Triton MoE writes its output into its input)."""
    for ref in _pinned:
        rows = ref()
        if rows is not None and hasattr(rows, PIN):
            delattr(rows, PIN)
    _pinned.clear()


def pinned_rows(x) -> tuple[torch.Tensor, Pinned] | None:
    """The rows ``x`` is (or is a view of) and their pinned groups, else None."""
    if not isinstance(x, torch.Tensor):
        return None
    for rows in (x, x._base):
        groups = getattr(rows, PIN, None)
        if groups is not None:
            return rows, groups
    return None


def _kept(args, kwargs) -> Kept | None:
    if _pending:
        return _pending.pop()
    found = pinned_rows(args[0] if args else kwargs.get("x"))
    if found is None:
        return None
    rows, groups = found
    return Kept(PINNED_HOOK, lambda arguments: groups.serves(rows, arguments),
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
