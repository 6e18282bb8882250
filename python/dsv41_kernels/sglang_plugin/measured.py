"""Where our op measured slower than what SGLang 0.5.23 itself runs at that call site.

A hook that loses to SGLang's own function on a GPU declines there, with the measurement as
its reason, until a benchmark shows it winning (``benchmark/``, quoted in
``docs/performance.md``). Each entry names the switch, the GPU architecture (compute
capability major; ``None``: every architecture, because no measurement shows a win anywhere),
the row range it covers and the figures. ``DSV41_KERNELS_FORCE`` (comma-separated switch
names) lifts these refusals, for benchmarks and tests that time or check our op in place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dsv41_kernels.admission import Admission, refuse

FORCE_ENV = "DSV41_KERNELS_FORCE"


@dataclass(frozen=True)
class SlowerThanSGLang:
    switch: str
    sm_major: int | None  # None: every architecture
    rows: range  # row counts (tokens) the measurement covers
    figures: str


SLOWER = (
    SlowerThanSGLang(
        "router",
        None,
        range(0, 1 << 31),
        "SGLang's one-launch packed gate is faster: 2.94 / 3.00 / 3.21 us against our "
        "3.67 / 3.73 / 3.90 us at T = 1 / 6 / 64 on the H200 (bench_moe_fused_gate.py); "
        "not measured faster on any GPU",
    ),
)


def forced(switch: str, environ=os.environ) -> bool:
    names = {name.strip().lower() for name in environ.get(FORCE_ENV, "").split(",")}
    return switch in names or "all" in names


def slower_than_sglang(switch: str, sm_major: int | None, rows: int) -> Admission | None:
    """The refusal where ``switch`` measured slower than SGLang's own function, else None."""
    if forced(switch):
        return None
    for entry in SLOWER:
        if entry.switch == switch and entry.sm_major in (None, sm_major) and rows in entry.rows:
            return refuse(f"measured slower than SGLang 0.5.23 here: {entry.figures}")
    return None


def measured_slower(switch: str) -> bool:
    """Whether ``switch`` declines somewhere because it measured slower (and is not forced)."""
    return not forced(switch) and any(entry.switch == switch for entry in SLOWER)
