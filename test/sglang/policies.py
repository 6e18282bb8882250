"""Policies for the tests: the H200's key, and a policy that declines one call site."""

from __future__ import annotations

H200 = {
    "gpu": "NVIDIA H200",
    "sm": "sm_90",
    "sm_count": 132,
    "sglang": "0.5.23",
    "dsv41_kernels": "0.1.0",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
}
"""The key the H200 gives (``policy.machine_key``): what the built-in H200 policy matches."""
GB300 = {**H200, "gpu": "NVIDIA GB300", "sm": "sm_103", "sm_count": 152}


def policy(key=H200, sites=None, date="2026-12-04T00:00:00+00:00") -> dict:
    """A policy's JSON object: ``sites`` maps a call site to its series."""
    return {"format": 1, "key": dict(key), "margin": 0.03, "date": date, "sites": sites or {}}


def series(ours, declined=(), columns=None) -> dict:
    """One series: ``ours`` ``[first, last]`` ranges, ``declined`` ``(first, last, why)``."""
    return {
        "columns": columns,
        "ours": [list(r) for r in ours],
        "declined": [{"rows": [a, b], "why": why} for a, b, why in declined],
    }


def declining_policy(site: str, why: str, key=H200) -> dict:
    """``key``'s policy that declines ``site`` at every row count and takes every other site."""
    from dsv41_kernels.sglang_plugin.policy import SITE_SWITCH

    sites = {name: {"series": [series([(0, None)])]} for name in SITE_SWITCH}
    sites[site] = {"series": [series([], [(0, None, why)])]}
    return policy(key, sites)
