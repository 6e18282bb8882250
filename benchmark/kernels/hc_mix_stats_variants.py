"""The mHC mixing statistics' launch-shape sweep (``bench_hc_mix_stats.py --sweep``): other
split-K shapes (:class:`~dsv41_kernels.ops.mhc.hc_mix_stats_plan.SplitKConfig`) than the plan's
default, run through the op with a forced plan, checked against float64 and timed, to tune the
defaults."""

from __future__ import annotations

import dataclasses

import torch
from common import record, timed

from dsv41_kernels.cases.hc_mix_stats import forced_admission, mix_relative_error
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats, hc_mix_stats_admission
from dsv41_kernels.ops.mhc.hc_mix_stats_plan import (
    Path,
    Projection,
    SplitKConfig,
    split_k_config,
    uses_wgmma,
)

SWEEP_ROWS = (6, 64, 256, 512, 1024, 2048, 4096)  # decode, and prefill sizes
CUDA_SWEEP_SPLITS = (4, 8, 12, 16, 24, 33, 48, 66)
"""K slices the sweep gives the CUDA projection (its default fills two CTAs an SM)."""


def sweep(x, holder, scale, base, ref, shape: str) -> list[dict]:
    """Records of every launch shape :func:`sweep_configs` gives at ``x``'s row count."""
    m, k = x.shape
    projection = hc_mix_stats_admission(x, holder, "compensated").plan.projection
    records = []
    for path, cfg in sweep_configs(m, k, cuda=projection is not Projection.TRITON):
        arm = f"{path} " + " ".join(f"{key}={v}" for key, v in dataclasses.asdict(cfg).items())
        try:
            admission = forced_admission(
                x, holder, path, projection if path == "compensated" else Projection.TRITON, cfg
            )
            run = lambda p=path, a=admission: hc_mix_stats(
                x, holder, scale, base, mode=p, return_mix=True, admission=a
            )
            out = run()
        except Exception as exc:  # a launch shape the kernels or the compiler refuse
            records.append(record("hc_mix_stats", shape, arm, None, error=repr(exc)[:200]))
            continue
        err = mix_relative_error(out[3], ref[3])
        records.append(timed("hc_mix_stats", shape, arm, run, mix_rel_err=err, sweep=True))
    return records


def sweep_configs(m: int, k: int, *, cuda: bool):
    """Launch shapes to time at ``m`` rows: the small-row path's slices and warps up to 64 rows;
    above, the CUDA projection's K slices and finisher rows where it runs (at the default's rows
    a CTA), else the Triton projection's tiles."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if m > 64 and cuda:
        wgmma = uses_wgmma(torch.device("cuda"))
        base = split_k_config(Path.COMPENSATED, m, k, sms, cuda=True, wgmma=wgmma)
        for splits in CUDA_SWEEP_SPLITS:
            for finish_rows in (2, 4, 8, 16, 32):
                yield (
                    "compensated",
                    dataclasses.replace(base, splits=splits, finish_rows=finish_rows),
                )
        return
    if m <= 64:
        base = split_k_config(Path.SMALL_ROW, m, k, sms)
        for splits in (16, 32, 64, 128, 256):
            for warps in (4, 8):
                yield "small_row", dataclasses.replace(base, splits=splits, num_warps=warps)
        return
    for block_m, warps in ((64, 4), (128, 4), (128, 8)):
        for block_k in (32, 64, 128):
            for stages in (2, 3, 4):
                tiles = -(-m // block_m)
                for per_sm in (1, 2):
                    splits = max(1, min(max(per_sm * sms // tiles, 4), k // block_k, 128))
                    yield (
                        "compensated",
                        SplitKConfig(
                            block_m,
                            block_k,
                            splits,
                            warps,
                            stages,
                            max(2, min(16, 256 // max(2, 1 << (splits - 1).bit_length()))),
                        ),
                    )
