"""The calibration's drivers (:mod:`dsv41_kernels.calibration.drivers`) drive SGLang's real call
sites. CPU tier: every site lists its cases without building an input; the smallest case of
each site whose call runs off CUDA goes through :func:`~dsv41_kernels.calibration.drivers.measure`
with one call standing in for a timing, and ours is taken by the hook in the ``ours`` arm."""

from __future__ import annotations

import pkgutil

import pytest
import torch

from dsv41_kernels.calibration import drivers

CPU_SITES = (
    "accept_greedy",
    "accept_greedy_epilogue",
    "row_argmax",
    "moe_fused_gate",
    "inverse_rope_quant_fp8",
)
"""The sites whose SGLang caller runs on CPU tensors (the mHC's at V4.1's 5120 columns would
take minutes in Triton's interpreter; FlashMLA is CUDA only)."""


def one_call(fn, rows):
    fn()
    return 0.0


def test_cases_are_listed_without_their_inputs(monkeypatch):
    """Listing draws no random input (every builder starts with a generator) and names each
    size once."""

    def no_generator(*args, **kwargs):
        raise AssertionError("an input was made while listing the cases")

    monkeypatch.setattr(torch, "Generator", no_generator)
    for site, driver in drivers.SITES.items():
        cases = driver.cases(torch.device("cpu"))
        assert cases and {case.op for case in cases} == {site}
        assert len({case.shape for case in cases}) == len(cases)
        assert all(case.rows > 0 for case in cases)


def test_sglangs_functions_are_hooks_in_their_modules(plugin):
    """Each case's ``sglang`` names bindings of hooked functions (what ``sglang_functions`` can
    put SGLang's own function back into), or none in a module or class the plugin hooks."""
    from dsv41_kernels.calibration.callers import hooked_names

    for driver in drivers.SITES.values():
        for case in driver.cases(torch.device("cpu")):
            for path, names in case.sglang:
                owner = pkgutil.resolve_name(path)
                assert names or hooked_names(owner), (case.op, path)
                for function in names or hooked_names(owner):
                    assert hasattr(getattr(owner, function), "__wrapped__"), (case.op, function)


@pytest.mark.parametrize("site", CPU_SITES)
def test_the_smallest_case_runs_in_both_arms(plugin, site):
    from dsv41_kernels.sglang_plugin import dispatch

    case = min(drivers.SITES[site].cases(torch.device("cpu")), key=lambda c: c.rows)
    arms = {arm: (us, why) for arm, us, why in drivers.measure(case, one_call)}
    assert arms[drivers.OURS_ARM] == (0.0, None)
    assert any(counts["ours"] for counts in dispatch.fire_counts().values())
    us, why = arms[drivers.SGLANG_ARM]
    assert (us, why) == (0.0, None) or (us is None and why), arms


def test_the_boundary_states_one_ranks_layout(sglang):
    """Past 64 rows SGLang's post asks the parallel layout whether prefill context parallelism
    interleaves; the boundary's call answers it as one rank does, with no server published."""
    from sglang.srt.layers.attention.dsa.utils import is_dsa_prefill_cp_interleave

    with drivers.one_rank_layout():
        assert is_dsa_prefill_cp_interleave() is False
