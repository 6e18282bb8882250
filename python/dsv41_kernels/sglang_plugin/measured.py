"""Where our op measured slower than what SGLang 0.5.23 itself runs at that call site.

A hook that loses to SGLang's own function on a GPU declines there, with the measurement as
its reason, until a benchmark (``benchmark/call_sites.py``, whose records the results file
keeps) shows it winning. Each entry names the switch, the GPU architecture (compute capability
major; ``None``: every architecture no other entry of the switch names, because no measurement
there shows a win), the row range it covers (and, where the call site's second dimension
decides too, its range) and why; an entry with no rows records an architecture where the
switch measured faster at every size, so that no ``None`` entry covers it. Between two
measured row counts, one a win and one a loss, the entry's range stops at the win: it starts
right after a win below it and ends right before a win above it. Rows where SGLang's own
function cannot run on the machine (the combine's rows between its two fused branches) have
no entry: our hook runs there. ``DSV41_KERNELS_FORCE`` (comma-separated switch names) lifts
these refusals, for benchmarks and tests that time or check our op in place.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.devices import sm_major
from dsv41_kernels.sglang_plugin.switches import FORCE_ENV, forced, switch_names

# FORCE_ENV, forced and switch_names are re-exported: the hooks and tests import them from here.
__all__ = ["FORCE_ENV", "SLOWER", "forced", "measured_slower", "slower_than_sglang", "switch_names"]


@dataclass(frozen=True)
class SlowerThanSGLang:
    switch: str
    sm_major: int | None  # None: every architecture no other entry of the switch names
    rows: range  # row counts (tokens) the measurement covers
    why: str
    columns: range | None = None  # sizes of the second dimension it covers (None: any)


SLOWER = (
    SlowerThanSGLang(  # no rows: measured faster at every token count, so SM90 is not None's
        "moe_fused_gate",
        9,
        range(0),
        "faster than SGLang's at every token count measured, 1-65536",
    ),
    SlowerThanSGLang(
        "moe_fused_gate",
        None,
        range(0, 1 << 31),
        "not measured on this GPU architecture (on the H200 ours is faster at every token count)",
    ),
    SlowerThanSGLang(
        "inverse_rope_quant_fp8",
        9,
        range(97, 1 << 31),
        "SGLang's RoPE + group quantizer chain is faster at TP 1 (64 local heads) from 97 tokens "
        "on the H200; ours wins up to 96",
        columns=range(33, 1 << 31),
    ),
    SlowerThanSGLang(
        "hc_combine_norm",
        9,
        range(4096, 1 << 31),
        "SGLang's fused hc_combine_norm is faster from 4096 rows on the H200; ours wins up to 96 "
        "rows",
    ),
)


@functools.cache
def _refusal(entry: SlowerThanSGLang) -> Admission:
    """An entry's refusal, made once."""
    return refuse(f"measured slower than SGLang 0.5.23 here: {entry.why}")


@functools.cache
def _named_archs(switch: str) -> frozenset[int]:
    """The architectures an entry of ``switch`` names (its ``None`` entries cover the rest)."""
    return frozenset(e.sm_major for e in SLOWER if e.switch == switch and e.sm_major is not None)


def slower_than_sglang(switch: str, rows: torch.Tensor) -> Admission | None:
    """The refusal where ``switch`` measured slower than SGLang's own function for ``rows``
    (its leading dimension is the row count; its device, the GPU), else None."""
    if forced(switch):
        return None
    arch = sm_major(rows.device.index) if rows.is_cuda else None
    named = _named_archs(switch)
    for entry in SLOWER:
        if (
            entry.switch == switch
            and (entry.sm_major == arch or (entry.sm_major is None and arch not in named))
            and rows.shape[0] in entry.rows
            and (entry.columns is None or (rows.dim() > 1 and rows.shape[1] in entry.columns))
        ):
            return _refusal(entry)
    return None


def measured_slower(switch: str) -> bool:
    """Whether ``switch`` declines somewhere because it measured slower than SGLang (and is not
    forced)."""
    return not forced(switch) and any(e.switch == switch for e in SLOWER)
