"""Where our op measured slower than what SGLang 0.5.23 itself runs at that call site.

A hook that loses to SGLang's own function on a GPU declines there, with the measurement as
its reason, until a benchmark shows it winning (``benchmark/``, quoted in
``docs/performance.md``). Each entry names the switch, the GPU architecture (compute
capability major; ``None``: every architecture no other entry of the switch names, because no
measurement there shows a win), the row range it covers (and, where the call site's second
dimension decides too, its range) and the figures; an entry with no rows records an
architecture where the switch measured faster at every size, so that no ``None`` entry covers
it. Between two measured row counts, one a win and one a loss, the entry's range stops at the
win: it starts right after a win below it and ends right before a win above it. Rows where
SGLang's own function cannot run on the machine (the combine's 97-4095,
``docs/performance.md``) have no entry: our hook runs there.
``DSV41_KERNELS_FORCE`` (comma-separated switch names) lifts these refusals, for benchmarks and
tests that time or check our op in place.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from dsv41_kernels.admission import Admission, refuse
from dsv41_kernels.devices import sm_major

FORCE_ENV = "DSV41_KERNELS_FORCE"


@dataclass(frozen=True)
class SlowerThanSGLang:
    switch: str
    sm_major: int | None  # None: every architecture no other entry of the switch names
    rows: range  # row counts (tokens) the measurement covers
    figures: str
    columns: range | None = None  # sizes of the second dimension it covers (None: any)


CALL_SITES_WO_A = "benchmark/call_sites.py --sites wo_a, docs/results/h200/session6"
"""The wo_a runs with the table read before the wait: ``r1`` and ``r3``."""
CALL_SITES_ROUTER = "benchmark/call_sites.py --sites router, docs/results/h200/session13"
"""``call2/logs/router_probe2.log``: the router's CUDA kernel to 65536 tokens against SGLang's,
back to back and after another launch."""
CALL_SITES = "benchmark/call_sites.py, docs/results/h200/session5"
"""The call-site runs of the dependent launches that let the next launch start early: ``r4``
(the combine's final kernel)."""
SLOWER = (
    SlowerThanSGLang(  # no rows: measured faster at every token count, so SM90 is not None's
        "router",
        9,
        range(0),
        f"faster than SGLang's at every token count measured, 1-65536 ({CALL_SITES_ROUTER})",
    ),
    SlowerThanSGLang(
        "router",
        None,
        range(0, 1 << 31),
        "not measured on this GPU architecture (on the H200 ours is faster at every token "
        f"count: {CALL_SITES_ROUTER})",
    ),
    SlowerThanSGLang(
        "wo_a",
        9,
        range(97, 1 << 31),
        "SGLang's RoPE + group quantizer chain is faster at TP 1 (64 local heads) at 384 tokens "
        "on the H200 (14.66 / 14.63 us against our 15.00 / 15.02 in two runs; "
        f"{CALL_SITES_WO_A}); ours wins up to 96 (4.44 / 4.42 against 4.81)",
        columns=range(33, 1 << 31),
    ),
    SlowerThanSGLang(
        "combine",
        9,
        range(4096, 1 << 31),
        "SGLang's fused hc_combine_norm is faster from 4096 rows on the H200 (51.54 / 97.92 / "
        "192.07 / 753.77 us against our 53.85 / 104.49 / 207.46 / 815.64 at 4096 / 8192 / "
        f"16384 / 65536; {CALL_SITES}/r4); ours wins up to 96 rows (2.53 against 2.86 us at 96)",
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
