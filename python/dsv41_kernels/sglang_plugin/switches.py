"""The switch names ``DSV41_KERNELS_DISABLE`` and ``DSV41_KERNELS_FORCE`` take.

A call site's switch is the name of the op it puts there. The names the switches had before
(``accept``, ``router``, ...) stay accepted as aliases of the op names, so that existing
serving configurations keep working; each one given is reported once per process as
deprecated.
"""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger("dsv41_kernels.sglang_plugin")

DISABLE_ENV = "DSV41_KERNELS_DISABLE"
FORCE_ENV = "DSV41_KERNELS_FORCE"
ALIASES = {
    "accept": "accept_greedy",
    "router": "moe_fused_gate",
    "combine": "hc_combine_norm",
    "sched": "decoding_sched_meta",
    "mhc": "hc_mix_stats",
    "wo_a": "inverse_rope_quant_fp8",
    "verify_gather": "sharded_accept_greedy",
}
"""Deprecated switch name -> the op name that replaced it."""

_deprecated_seen: set[str] = set()


def _deprecated(old: str, new: str) -> None:
    """One WARNING line per deprecated name and process (Python's last-resort handler shows it
    on stderr before SGLang configures logging)."""
    if old in _deprecated_seen:
        return
    _deprecated_seen.add(old)
    logger.warning(
        "dsv41-kernels: switch name %r (%s / %s) is deprecated, use %r",
        old,
        DISABLE_ENV,
        FORCE_ENV,
        new,
    )


@functools.lru_cache(maxsize=16)
def switch_names(value: str) -> frozenset[str]:
    """The names in a comma-separated switch list, stripped, lower-cased, deprecated names
    mapped to their op names (cached: hooks ask on every call)."""
    names = set()
    for item in value.split(","):
        name = item.strip().lower()
        if not name:
            continue
        if name in ALIASES:
            _deprecated(name, ALIASES[name])
            name = ALIASES[name]
        names.add(name)
    return frozenset(names)


def forced(switch: str, environ=os.environ) -> bool:
    """Whether ``DSV41_KERNELS_FORCE`` names ``switch`` (or ``all``)."""
    names = switch_names(environ.get(FORCE_ENV, ""))
    return switch in names or "all" in names
