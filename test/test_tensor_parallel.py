"""Ranks of one tensor-parallel group take the same kernels for the mHC combine and statistics.

Their outputs feed the residual streams every rank holds a copy of, and their CUDA and Triton
kernels differ in the last bit, so a rank must never take the other kernel because its machine
lacks a CUDA toolchain. Two CPU processes in a gloo group, one with a toolchain and one
without, choose for GPU-shaped arguments (metadata that says ``cuda:0``, sm_90) and compare;
then a hook of ours that raises on one rank must raise there, not answer with SGLang's bits.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dsv41_kernels.admission import admit
from dsv41_kernels.ops.mhc import hc_mix_stats_plan
from dsv41_kernels.ops.mhc.hc_combine_norm import hc_combine_norm_admission
from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats_admission
from dsv41_kernels.sglang_plugin import dispatch

from .machine import on_cuda, pretend_arch, pretend_toolchain

WORLD = 2


def kernel_choices() -> list[str | None]:
    """The kernel each admission names for V4.1's decode and prefill shapes on sm_90."""
    choices = []
    for rows, hidden in ((1, 5120), (6, 5120), (300, 4096)):
        x = on_cuda(torch.empty(rows, 4 * hidden, dtype=torch.bfloat16))
        pre = on_cuda(torch.empty(rows, 4))
        weight = on_cuda(torch.empty(hidden, dtype=torch.bfloat16))
        fn = on_cuda(torch.empty(24, 4 * hidden))
        for quantize in (False, True):
            choices.append(hc_combine_norm_admission(x, pre, weight, quantize=quantize).kernel)
        for mode in ("auto", "compensated", "batch_invariant"):
            choices.append(hc_mix_stats_admission(x, fn, mode).kernel)
    return choices


def gathered(value) -> list:
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def one_rank(rank: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        pretend_toolchain(rank == 0)  # rank 1's machine cannot build the CUDA modules
        pretend_arch(9)
        hc_mix_stats_plan.multiprocessors = lambda index: 132  # the plan's launch shape asks
        choices = gathered(kernel_choices())
        assert choices[0] == choices[1], choices
        assert "cuda cluster" in choices[0] and "compensated/cuda wgmma" in choices[0], choices[0]

        def ours():
            if rank == 1:
                raise RuntimeError("the CUDA module cannot be loaded on this rank")
            return "ours"

        outcomes = []
        for replicated in (True, False):
            try:
                outcomes.append(
                    dispatch.run(
                        f"test.replicated={replicated}",
                        admit("test"),
                        ours,
                        lambda: "sglang",
                        replicated=replicated,
                    )
                )
            except RuntimeError:
                outcomes.append("raised")
        assert gathered(outcomes) == [["ours", "ours"], ["raised", "sglang"]]
    finally:
        dist.destroy_process_group()


def test_ranks_with_and_without_a_toolchain_choose_alike(tmp_path):
    mp.spawn(one_rank, args=(str(tmp_path / "rendezvous"),), nprocs=WORLD, join=True)


def test_a_single_process_still_falls_back():
    """Without a group there are no other copies to drift from: SGLang's function answers."""

    def broken():
        raise RuntimeError("injected")

    try:
        assert dispatch.run("test.single", admit("test"), broken, lambda: "sglang", replicated=True)
    finally:
        dispatch.reset()


@pytest.mark.gpu
def test_gpu_a_machine_that_cannot_load_the_module_raises(monkeypatch):
    """On the GPU itself: without a toolchain the admissions still name the CUDA kernels, and
    when the module cannot be loaded the ops raise rather than return the Triton kernels'
    (different) bits."""
    from dsv41_kernels.cases.hc_combine_norm import example_inputs as combine_inputs
    from dsv41_kernels.cases.hc_mix_stats import example_inputs as mix_inputs
    from dsv41_kernels.ops.mhc import hc_combine_norm as combine
    from dsv41_kernels.ops.mhc import hc_mix_stats as mix_stats_op
    from dsv41_kernels.ops.mhc.hc_mix_stats import hc_mix_stats

    x, pre, weight = combine_inputs(6, 5120, "cuda", seed=1)
    mix_x, fn, scale, base = mix_inputs(300, 5120, device="cuda", seed=2)
    pretend_toolchain(False, monkeypatch.setattr)
    assert hc_combine_norm_admission(x, pre, weight).kernel == combine.CUDA_CLUSTER
    assert hc_combine_norm_admission(x, pre, weight, quantize=True).kernel == combine.CUDA_CLUSTER
    assert hc_mix_stats_admission(mix_x, fn, "compensated").kernel.startswith("compensated/cuda")

    def cannot_load(name, device_index=0):
        raise RuntimeError(f"cannot load {name} here")

    monkeypatch.setattr(combine, "load_module", cannot_load)
    monkeypatch.setattr(mix_stats_op, "load_module", cannot_load)
    with pytest.raises(RuntimeError, match="cannot load hc_combine_norm"):
        combine.hc_combine_norm(x, pre, weight, 1e-6)
    with pytest.raises(RuntimeError, match="cannot load hc_combine_norm"):
        combine.hc_combine_norm_mxfp8(x, pre, weight, 1e-6)
    with pytest.raises(RuntimeError, match="cannot load hc_mix_stats"):
        hc_mix_stats(mix_x, fn, scale, base, mode="compensated")
