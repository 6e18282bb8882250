"""Where our op measured slower than what SGLang 0.5.23 itself runs at that call site.

A hook that loses to SGLang's own function on a GPU declines there, with the measurement as
its reason, until a benchmark shows it winning (``benchmark/``, quoted in
``docs/performance.md``). Each entry names the switch, the GPU architecture (compute
capability major; ``None``: every architecture, because no measurement shows a win anywhere),
the row range it covers and the figures. ``DSV41_KERNELS_FORCE`` (comma-separated switch
names) lifts these refusals, for benchmarks and tests that time or check our op in place.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.jit import sm_major

FORCE_ENV = "DSV41_KERNELS_FORCE"


@dataclass(frozen=True)
class SlowerThanSGLang:
    switch: str
    sm_major: int | None  # None: every architecture
    rows: range  # row counts (tokens) the measurement covers
    figures: str


CALL_SITES = "benchmark/call_sites.py, docs/results/h200-2026-12-01"
SLOWER = (
    SlowerThanSGLang(
        "router",
        None,
        range(0, 1 << 31),
        "SGLang's one-launch packed gate is faster: 2.91 / 3.00 / 3.07 / 4.57 us against our "
        f"3.65 / 3.72 / 3.77 / 4.83 us at T = 1 / 6 / 64 / 1024 on the H200 ({CALL_SITES}); "
        "not measured faster on any GPU",
    ),
    SlowerThanSGLang(
        "mhc",
        9,
        range(129, 4096),
        "SGLang's hc_mix_stats_sinkhorn_bf16x3 is faster from 256 to 2048 rows on the H200 "
        "(14.63 / 14.72 / 22.18 / 36.42 us against our 14.76 / 17.99 / 26.94 / 39.55; "
        f"{CALL_SITES}); ours wins at 128 and from 4096",
    ),
    SlowerThanSGLang(
        "combine",
        9,
        range(65, 97),
        f"SGLang's fused hc_combine_norm: 2.91 us against our 2.93 at 96 rows on the H200 "
        f"({CALL_SITES}); ours wins up to 64",
    ),
    SlowerThanSGLang(
        "combine",
        9,
        range(4096, 1 << 31),
        "SGLang's fused hc_combine_norm is faster from 4096 rows on the H200 (51.98 / 193.7 / "
        f"761.4 us against our 54.38 / 207.3 / 812.0 at 4096 / 16384 / 65536; {CALL_SITES})",
    ),
)


NOT_BITWISE = (
    SlowerThanSGLang(
        "wo_a",
        9,
        range(0, 1 << 31),
        "inverse_rope_quant_fp8 has not yet passed its GPU tests against SGLang's two kernels: "
        "on the H200 its e4m3 bytes differed in a quarter of the values, then (after the fix of "
        "that and of the reciprocal's model) in 2 of 8192, a -0 rotated to +0, fixed since but "
        "not yet run there (docs/performance.md, docs/results/h200/wo_a_fix)",
    ),
)
"""Where our op measured not bitwise equal to SGLang's own function: the hook declines there
(the same table shape; ``figures`` says what differs)."""


@functools.lru_cache(maxsize=16)
def switch_names(value: str) -> frozenset[str]:
    """The names in a comma-separated switch list (``DSV41_KERNELS_FORCE``,
    ``DSV41_KERNELS_DISABLE``), stripped and lower-cased (cached: hooks ask on every call)."""
    return frozenset(name.strip().lower() for name in value.split(",") if name.strip())


def forced(switch: str, environ=os.environ) -> bool:
    names = switch_names(environ.get(FORCE_ENV, ""))
    return switch in names or "all" in names


@functools.cache
def _refusal(entry: SlowerThanSGLang, words: str) -> Admission:
    """An entry's refusal, made once."""
    return refuse(f"measured {words} SGLang 0.5.23 here: {entry.figures}")


def slower_than_sglang(switch: str, rows: torch.Tensor) -> Admission | None:
    """The refusal where ``switch`` measured slower than SGLang's own function for ``rows``
    (its leading dimension is the row count; its device, the GPU), or not bitwise equal to it,
    else None."""
    if forced(switch):
        return None
    arch = sm_major(rows.device.index) if rows.is_cuda else None
    for table, words in ((NOT_BITWISE, "not bitwise equal to"), (SLOWER, "slower than")):
        for entry in table:
            if (
                entry.switch == switch
                and entry.sm_major in (None, arch)
                and rows.shape[0] in entry.rows
            ):
                return _refusal(entry, words)
    return None


def measured_slower(switch: str) -> bool:
    """Whether ``switch`` declines somewhere because it measured slower than SGLang or not
    bitwise equal to it (and is not forced)."""
    return not forced(switch) and any(e.switch == switch for e in (*NOT_BITWISE, *SLOWER))
