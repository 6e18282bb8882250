"""The policy layer (``sglang_plugin.policy``): its file, which one applies to a GPU, the
default without one, the start-up line, and the hooks honouring it through SGLang's callers."""

from __future__ import annotations

import json

import pytest
import torch

from test.sglang import callers, policies
from test.sglang.policies import GB300, H200

NOT_MEASURED = "not measured on {}; run `dsv41-kernels calibrate`"


def meta(*shape):
    return torch.empty(shape, device="meta")


def test_parse_rejects_what_it_cannot_read():
    from dsv41_kernels.sglang_plugin.policy import parse

    good = policies.policy(sites={"accept_greedy": {"series": [policies.series([(0, None)])]}})
    assert parse(good).sites["accept_greedy"][0].ours == ((0, None),)
    with pytest.raises(ValueError, match="format"):
        parse({**good, "format": 2})
    with pytest.raises(ValueError, match="key lacks sm_count"):
        parse({**good, "key": {**H200, "sm_count": None}})
    with pytest.raises(ValueError, match="unknown call site 'router'"):
        parse({**good, "sites": {"router": good["sites"]["accept_greedy"]}})


def test_ranges_and_reasons():
    from dsv41_kernels.sglang_plugin.policy import parse

    declined = [(97, 200, "slower at 150"), (401, None, "slower at 500")]
    sites = {"hc_combine_norm": {"series": [policies.series([(0, 96), (201, 400)], declined)]}}
    p = parse(policies.policy(sites=sites), "p.json")
    assert [p.refusal("hc_combine_norm", rows) for rows in (0, 96, 201, 400)] == [None] * 4
    assert p.refusal("hc_combine_norm", 97).reason.endswith(": slower at 150")
    assert p.refusal("hc_combine_norm", 1 << 40).reason.endswith(": slower at 500")
    absent = p.refusal("hc_mix_stats", 6).reason  # a site the policy does not hold
    assert absent == f"hc_mix_stats {NOT_MEASURED.format('NVIDIA H200')} (not in p.json)"


@pytest.mark.parametrize(
    "field, value",
    [("gpu", "NVIDIA H100 80GB HBM3"), ("sm", "sm_100"), ("sm_count", 114), ("sglang", "0.5.24")],
)
def test_another_gpu_or_sglang_never_applies(plugin, on_gpu, field, value):
    """A policy keyed on another GPU name, arch, SM count or SGLang release is never used: every
    hook declines as on a GPU with none."""
    machine = {**H200, field: value}
    policy = on_gpu(machine=machine, policy=policies.declining_policy("hc_combine_norm", "x"))
    found = policy.for_device(0)
    assert found.policy is None and "every hook declines" in found.note
    refusal = policy.policy_refusal("accept_greedy", meta(6, 10))
    assert refusal.reason == NOT_MEASURED.format(machine["gpu"])


def test_other_library_versions_apply_and_are_named(plugin, on_gpu):
    machine = {**H200, "torch": "2.12.0+cu130", "cuda": "13.1"}
    policy = on_gpu(machine=machine, policy=policies.declining_policy("hc_combine_norm", "x"))
    found = policy.for_device(0)
    assert found.policy is not None
    assert "torch 2.12.0+cu130 (calibrated 2.11.0+cu130), cuda 13.1 (calibrated 13.0)" in found.note
    assert "run `dsv41-kernels calibrate` again" in found.note
    assert policy.policy_refusal("hc_combine_norm", meta(6, 4, 8)).reason.endswith(": x")


def test_every_hook_declines_without_a_policy_and_force_lifts_it(plugin, on_gpu, monkeypatch):
    policy = on_gpu(machine=GB300)
    for site, switch in policy.SITE_SWITCH.items():
        refusal = policy.policy_refusal(site, meta(6, 64, 512))
        assert refusal.reason == NOT_MEASURED.format("NVIDIA GB300"), site
        monkeypatch.setenv("DSV41_KERNELS_FORCE", switch)
        assert policy.policy_refusal(site, meta(6, 64, 512)) is None
        monkeypatch.delenv("DSV41_KERNELS_FORCE")


def test_sharded_accept_stays_off_unless_forced(plugin, on_gpu):
    """The built-in H200 policy holds no figures of the sharded accept (issue 19); it stays off
    until forced, as without a policy."""
    from dsv41_kernels.sglang_plugin import sharded_accept_greedy as hooks

    assert on_gpu().for_device(0).policy.sites.get("sharded_accept_greedy") is None
    assert hooks.defer_admission(object()).reason == hooks.UNRUN


def built_in_date() -> str:
    """The shipped H200 policy's date (its records' latest), which the notes name."""
    from dsv41_kernels.sglang_plugin.policy import BUILT_IN_DIR

    return json.loads((BUILT_IN_DIR / "policy-h200-sm_90-132sm-sglang0.5.23.json").read_text())[
        "date"
    ]


def test_where_policies_are_found(on_gpu, tmp_path, monkeypatch):
    """``DSV41_KERNELS_POLICY`` alone when set; else the user cache (its latest matching file)
    before the built-in policy."""
    policy = on_gpu()
    built_in = policy.for_device(0)
    assert built_in.policy.path.endswith("policy-h200-sm_90-132sm-sglang0.5.23.json")
    assert f"(built-in; NVIDIA H200, {built_in_date()})" in built_in.note
    cache = tmp_path / "cache"
    cache.mkdir()
    for name, date in (("a.json", "2027-01-02"), ("b.json", "2027-01-01")):
        (cache / name).write_text(json.dumps(policies.policy(date=date)))
    (cache / "other-gpu.json").write_text(json.dumps(policies.policy(GB300, date="2028")))
    (cache / "broken.json").write_text("{")
    policy.for_device.cache_clear()
    found = policy.for_device(0)
    assert found.policy.path == str(cache / "a.json") and "(user cache;" in found.note
    assert f"unreadable {cache / 'broken.json'}" in found.note
    monkeypatch.setenv(policy.POLICY_ENV, str(cache / "other-gpu.json"))
    policy.for_device.cache_clear()
    found = policy.for_device(0)
    assert found.policy is None and str(cache / "other-gpu.json") in found.note


def test_startup_line_names_the_policy(plugin, on_gpu, monkeypatch):
    from dsv41_kernels import sglang_plugin
    from dsv41_kernels.sglang_plugin import policy

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    line = sglang_plugin.report_line({switch: "on" for switch in sglang_plugin.SWITCHES})
    assert "; policy: looked up at the first hooked call on each GPU, and logged then" in line
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    on_gpu()
    line = sglang_plugin.report_line({switch: "on" for switch in sglang_plugin.SWITCHES})
    assert f"; policy: {policy.BUILT_IN_DIR}/policy-h200-sm_90-132sm-sglang0.5.23.json" in line
    assert f"(built-in; NVIDIA H200, {built_in_date()})" in line
    on_gpu(machine=GB300)
    line = sglang_plugin.report_line({switch: "on" for switch in sglang_plugin.SWITCHES})
    assert "; policy: none for NVIDIA GB300 sm_103 with SGLang 0.5.23" in line
    assert line.endswith("every hook declines; run `dsv41-kernels calibrate`")
    monkeypatch.setenv("DSV41_KERNELS_FORCE", "hc_mix_stats")
    line = sglang_plugin.report_line({switch: "on" for switch in sglang_plugin.SWITCHES})
    assert line.endswith("; DSV41_KERNELS_FORCE lifts the policy for hc_mix_stats")


def test_startup_line_without_cuda(plugin, monkeypatch):
    from dsv41_kernels import sglang_plugin

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = sglang_plugin.report_line({"accept_greedy": "on"})
    assert line.endswith("; policy: no CUDA device (hooks on CUDA tensors follow a GPU's policy)")


def test_hooks_honour_a_policy_through_sglangs_callers(
    plugin, fired, on_gpu, sglang_torch_sinkhorn
):
    """A policy that declines the combine: SGLang's combine runs, counted with the policy's
    reason, while the mixing statistics of the same layer take ours; without any policy (a GB300)
    both decline."""
    from sglang.srt.models import deepseek_v4_mhc as mhc

    gen = torch.Generator().manual_seed(3)
    hc = callers.v41_decoder_layer(gen, "cpu", hidden=64).attn_hc
    x = torch.randn(3, 4, 64, generator=gen).bfloat16()
    pre = torch.rand(3, 4, generator=gen) + 0.1
    on_gpu(policy=policies.declining_policy("hc_combine_norm", "SGLang's 1 us, ours 2 us"))
    mhc.combine(hc, mhc.HcState(x, pre))
    mhc.mix_stats(hc, x)
    counts = fired()
    reason = "measured slower than SGLang 0.5.23 here: SGLang's 1 us, ours 2 us"
    assert counts["hc_combine_norm._combine"] == {"ours": 0, "sglang": {reason: 1}}
    assert counts["hc_mix_stats._mix_stats_impl"] == {"ours": 1, "sglang": {}}
    on_gpu(machine=GB300)
    mhc.combine(hc, mhc.HcState(x, pre))
    mhc.mix_stats(hc, x)
    counts = fired()
    declined = {NOT_MEASURED.format("NVIDIA GB300"): 1}
    assert counts["hc_combine_norm._combine"]["sglang"] == {reason: 1, **declined}
    assert counts["hc_mix_stats._mix_stats_impl"] == {"ours": 1, "sglang": declined}
