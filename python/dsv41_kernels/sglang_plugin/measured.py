"""Where our op measured slower than what SGLang 0.5.23 itself runs at that call site.

A hook that loses to SGLang's own function on a GPU declines there, with the measurement as
its reason, until a benchmark shows it winning (``benchmark/``, quoted in
``docs/performance.md``). Each entry names the switch, the GPU architecture (compute
capability major; ``None``: every architecture, because no measurement shows a win anywhere),
the row range it covers (and, where the call site's second dimension decides too, its range)
and the figures. Between two measured row counts, one a win and one a loss, an entry starts
right after the win. Rows where SGLang's own function cannot run on the machine (the combine's
97-4095, ``docs/performance.md``) have no entry: our hook runs there.
``DSV41_KERNELS_FORCE`` (comma-separated switch names) lifts these refusals, for benchmarks and
tests that time or check our op in place.
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
    columns: range | None = None  # sizes of the second dimension it covers (None: any)


CALL_SITES = "benchmark/call_sites.py, docs/results/h200/bench"
CALL_SITES_PDL = "benchmark/call_sites.py, docs/results/h200/session4"
"""The call-site run after the CUDA kernels of combine and wo_a became dependent launches."""
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
        range(4096, 1 << 31),
        "SGLang's fused hc_combine_norm is faster from 4096 rows on the H200 (51.39 / 97.88 / "
        "192.3 / 753.2 us against our 53.66 / 104.3 / 206.2 / 818.0 at 4096 / 8192 / 16384 / "
        f"65536; {CALL_SITES_PDL}); ours wins up to 96 rows (2.61 against 2.86 us at 96)",
    ),
    SlowerThanSGLang(
        "wo_a",
        9,
        range(25, 1 << 31),
        "SGLang's RoPE + group quantizer chain is faster at TP 1 (64 local heads) from 96 tokens "
        "on the H200 (4.87 / 14.67 us against our 5.14 / 16.91 at T = 96 / 384; "
        f"{CALL_SITES_PDL}); ours wins up to 24 (1.46 against 2.08 us at T = 6)",
        columns=range(33, 1 << 31),
    ),
    SlowerThanSGLang(
        "wo_a",
        9,
        range(97, 1 << 31),
        "SGLang's RoPE + group quantizer chain is faster at TP 2 / 4 (32 / 16 local heads) at "
        "384 tokens on the H200 (21.00 / 11.88 us against our 21.93 / 12.15; "
        f"{CALL_SITES_PDL}); ours wins up to 96 (7.91 against 8.15 / 5.57 against 6.16 us)",
        columns=range(0, 33),
    ),
)


@functools.lru_cache(maxsize=16)
def switch_names(value: str) -> frozenset[str]:
    """The names in a comma-separated switch list (``DSV41_KERNELS_FORCE``,
    ``DSV41_KERNELS_DISABLE``), stripped and lower-cased (cached: hooks ask on every call)."""
    return frozenset(name.strip().lower() for name in value.split(",") if name.strip())


def forced(switch: str, environ=os.environ) -> bool:
    names = switch_names(environ.get(FORCE_ENV, ""))
    return switch in names or "all" in names


@functools.cache
def _refusal(entry: SlowerThanSGLang) -> Admission:
    """An entry's refusal, made once."""
    return refuse(f"measured slower than SGLang 0.5.23 here: {entry.figures}")


def slower_than_sglang(switch: str, rows: torch.Tensor) -> Admission | None:
    """The refusal where ``switch`` measured slower than SGLang's own function for ``rows``
    (its leading dimension is the row count, its second the columns an entry may name; its
    device, the GPU), else None."""
    if forced(switch):
        return None
    arch = sm_major(rows.device.index) if rows.is_cuda else None
    for entry in SLOWER:
        if (
            entry.switch == switch
            and entry.sm_major in (None, arch)
            and rows.shape[0] in entry.rows
            and (entry.columns is None or (rows.dim() > 1 and rows.shape[1] in entry.columns))
        ):
            return _refusal(entry)
    return None


def measured_slower(switch: str) -> bool:
    """Whether ``switch`` declines somewhere because it measured slower than SGLang (and is not
    forced)."""
    return not forced(switch) and any(e.switch == switch for e in SLOWER)
