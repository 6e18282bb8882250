"""``dsv41-kernels calibrate``'s decision (:func:`dsv41_kernels.calibrate.decide`) over
synthetic records, the shipped H200 policy as the output of ``--from-records``, and the
command line on a machine without CUDA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv41_kernels import cli
from dsv41_kernels.calibrate import OURS_ARM, SGLANG_ARM, decide, dumps, file_name, from_records
from dsv41_kernels.sglang_plugin.policy import BUILT_IN_DIR, parse

ROOT = Path(__file__).resolve().parents[1]
MACHINE = {"device": "NVIDIA X", "sm": "sm_100", "sglang": "0.5.23", "torch": "2", "cuda": "13"}


def records(op, timings, columns=None, date="2027-01-01"):
    """``timings``: ``{rows: (sglang us per repeat, ours us per repeat)}``."""
    out = []
    for rows, (sglang, ours) in timings.items():
        for arm, values in ((SGLANG_ARM, sglang), (OURS_ARM, ours)):
            for us in values:
                shape = f"T {rows}" if columns is None else f"T {rows}: o [{rows}, {columns}, 512]"
                out.append(
                    {"op": op, "shape": shape, "arm": arm, "us": us, "rows": rows, "date": date}
                    | MACHINE
                )
    return out


def series(policy, op, index=0):
    s = policy["sites"][op]["series"][index]
    return s["ours"], [d["rows"] for d in s["declined"]]


def test_margin_must_hold_in_every_repeat():
    timings = {
        6: ([10.0, 10.0], [9.0, 9.0]),  # 10 % faster in both
        24: ([10.0, 10.0], [9.0, 9.8]),  # 2 % in one repeat: SGLang's
        96: ([10.0, 10.0], [9.6, 9.6]),  # 4 %
    }
    policy = decide(records("hc_mix_stats", timings), 0.03, sm_count=148)
    assert series(policy, "hc_mix_stats") == ([[0, 6], [96, None]], [[7, 95]])
    why = policy["sites"]["hc_mix_stats"]["series"][0]["declined"][0]["why"]
    assert why == (
        "NVIDIA X: not 3% faster than SGLang's in every repeat at 24 rows: "
        "SGLang's 10.00/10.00 us, ours 9.00/9.80 us"
    )
    loose = decide(records("hc_mix_stats", timings), 0.01, sm_count=148)
    assert series(loose, "hc_mix_stats") == ([[0, None]], [])


def test_gaps_ends_and_arms_that_did_not_run():
    """Between two sizes ours runs only when both are ours; the ends extend the nearest size;
    SGLang's function not running leaves ours, ours not running leaves SGLang's."""
    timings = {
        8: ([None], [1.0]),  # SGLang's function did not run: ours
        64: ([2.0], [1.0]),
        512: ([2.0], [3.0]),  # slower
        4096: ([2.0], [1.0]),
        8192: ([2.0], [None]),  # ours did not run
    }
    policy = decide(records("hc_combine_norm", timings), sm_count=148)
    assert series(policy, "hc_combine_norm") == (
        [[0, 64], [4096, 4096]],
        [[65, 4095], [4097, None]],
    )
    measured = policy["sites"]["hc_combine_norm"]["series"][0]["measured"]
    assert measured[0] == {"rows": 8, "sglang_us": [None], "ours_us": [1.0], "ours": True}


def test_second_dimension_and_key():
    timings_64 = {6: ([2.0], [1.0]), 384: ([2.0], [2.5])}
    timings_16 = {6: ([2.0], [1.0]), 384: ([2.0], [1.0])}
    recs = records("inverse_rope_quant_fp8", timings_64, columns=64)
    recs += records("inverse_rope_quant_fp8", timings_16, columns=16, date="2027-02-01")
    policy = decide(recs, sm_count=148, source={"command": "x"})
    site = policy["sites"]["inverse_rope_quant_fp8"]
    assert site["columns"] == "local heads" and [s["columns"] for s in site["series"]] == [16, 64]
    assert series(policy, "inverse_rope_quant_fp8", 1) == ([[0, 6]], [[7, None]])
    assert policy["key"] == {
        "gpu": "NVIDIA X",
        "sm": "sm_100",
        "sm_count": 148,
        "sglang": "0.5.23",
        "dsv41_kernels": "0.1.0",
        "torch": "2",
        "cuda": "13",
    }
    assert policy["date"] == "2027-02-01" and policy["source"] == {"command": "x", "commits": []}
    assert "accept_greedy" in policy["unmeasured"]
    parsed = parse(json.loads(dumps(policy)))
    assert parsed.refusal("inverse_rope_quant_fp8", 384, 32) is not None  # 64 declines there
    assert parsed.refusal("inverse_rope_quant_fp8", 384, 16) is None
    assert file_name(policy["key"]) == "policy-x-sm_100-148sm-sglang0.5.23.json"


def test_records_of_two_machines_are_refused():
    recs = records("hc_mix_stats", {6: ([2.0], [1.0])})
    recs[0] = {**recs[0], "device": "NVIDIA Y"}
    with pytest.raises(ValueError, match="several devices"):
        decide(recs, sm_count=1)


def test_shipped_h200_policy_is_what_from_records_writes(monkeypatch):
    """The built-in H200 policy is generated, not typed: the command it names, run on the
    results file, writes it byte for byte."""
    (shipped,) = BUILT_IN_DIR.glob("*.json")
    policy = json.loads(shipped.read_text())
    assert policy["source"]["command"] == (
        "dsv41-kernels calibrate --from-records docs/results/h200.jsonl --sm-count 132"
    )
    monkeypatch.chdir(ROOT)
    assert dumps(from_records(["docs/results/h200.jsonl"], 0.03, 132)) == shipped.read_text()
    assert shipped.name == file_name(policy["key"])


def test_cli_from_records_writes_the_policy(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "p.json"
    argv = ["calibrate", "--from-records", "docs/results/h200.jsonl", "--sm-count", "132"]
    assert cli.main([*argv, "--out", str(out), "--sites", "hc_combine_norm", "--json"]) == 0
    written = json.loads(out.read_text())
    assert list(written["sites"]) == ["hc_combine_norm"]
    assert json.loads(capsys.readouterr().out) == written
    assert cli.main([*argv[:3], "--out", str(out)]) == 2  # no --sm-count
    assert cli.main([*argv, "--sites", "router"]) == 2


def test_cli_without_cuda_says_so(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["calibrate"]) == 1
    assert "on a CUDA GPU and none is here" in capsys.readouterr().err


def test_cli_on_a_gpu_writes_the_timed_policy(monkeypatch, tmp_path):
    """The GPU path with the timing stood in: the records go to decide() and the policy lands in
    the folder given, under the key's file name."""
    import types

    import torch

    from dsv41_kernels import calibrate_cli

    timings = {6: ([2.0] * 3, [1.0] * 3), 384: ([2.0] * 3, [2.0] * 3)}
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: types.SimpleNamespace(multi_processor_count=148),
    )
    monkeypatch.setattr(
        calibrate_cli,
        "time_sites",
        lambda sites, repeats, started: (
            asked.append((sites, repeats)) or records("hc_mix_stats", timings)
        ),
    )
    assert cli.main(["calibrate", "--out", str(tmp_path), "--sites", "hc_mix_stats"]) == 0
    assert asked == [(["hc_mix_stats"], 3)]
    written = json.loads((tmp_path / "policy-x-sm_100-148sm-sglang0.5.23.json").read_text())
    assert series(written, "hc_mix_stats") == ([[0, 6]], [[7, None]])


class StandIn(BaseException):
    """Like an SGLang environment's stand-in: a BaseException, so ``except Exception`` misses
    it."""


@pytest.fixture
def fake_sites(monkeypatch):
    """``time_sites`` on the CPU over one fake call site (``hc_combine_norm``): its SGLang
    function raises :class:`StandIn` at 128 rows, its inputs cannot be built at 256; the plugin
    load and the machine are stood in, a timing is one call. Returns the events in order."""
    import functools
    import sys
    import types

    from dsv41_kernels import calibrate_cli
    from dsv41_kernels.calibration import drivers

    events = []
    module = types.ModuleType("fake_call_site")

    def sglang_function(rows):
        if rows == 128:
            raise StandIn("sgl_kernel.rmsnorm is a stand-in here")
        return 2.0

    def hook(rows):
        return 1.0

    hook.__wrapped__ = sglang_function
    module.combine = hook
    monkeypatch.setitem(sys.modules, module.__name__, module)

    def build(rows):
        events.append(("build", rows))
        if rows == 256:
            raise ImportError("no tilelang")
        return lambda: events.append(("run", rows)) or module.combine(rows)

    def cases(device):
        return [
            drivers.Case(
                "hc_combine_norm",
                f"[{r}, 4, 5120] bf16",
                r,
                ((module.__name__, ("combine",)),),
                functools.partial(build, r),
            )
            for r in (6, 128, 256)
        ]

    monkeypatch.setattr(drivers, "SITES", {"hc_combine_norm": drivers.Driver("combine", cases)})
    monkeypatch.setattr(calibrate_cli, "_load_plugins", lambda: None)
    monkeypatch.setattr(calibrate_cli, "_machine", lambda device: dict(MACHINE))
    monkeypatch.setattr(calibrate_cli, "_timed", lambda fn, rows: fn())
    return events


def test_time_sites_records_an_arm_that_cannot_run_with_its_error(fake_sites, capsys):
    """A BaseException in an arm (an SGLang stand-in reached) or in building the inputs leaves
    a record without a figure that says why; each size's inputs are built just before its
    timings; the seconds before the first timing and in all are printed."""
    from dsv41_kernels.calibrate_cli import time_sites

    records = time_sites(None, 2)
    by = {(r["rows"], r["arm"]): r for r in records}
    assert len(records) == 3 * 2 * 2
    assert by[(6, SGLANG_ARM)]["us"] == 2.0 and by[(6, OURS_ARM)]["us"] == 1.0
    assert "error" not in by[(6, OURS_ARM)]
    assert by[(128, SGLANG_ARM)]["us"] is None
    assert by[(128, SGLANG_ARM)]["error"] == "StandIn: sgl_kernel.rmsnorm is a stand-in here"
    assert by[(128, OURS_ARM)]["us"] == 1.0
    assert by[(256, OURS_ARM)]["error"] == "inputs not built: ImportError: no tilelang"
    assert [e for e in fake_sites if e[0] == "build"] == [
        ("build", 6),
        ("build", 128),
        ("build", 256),
    ]
    assert fake_sites.index(("build", 128)) > max(
        i for i, e in enumerate(fake_sites) if e == ("run", 6)
    )
    assert "s before the first timing, " in capsys.readouterr().err

    policy = decide(records, sm_count=148)
    measured = {m["rows"]: m for m in policy["sites"]["hc_combine_norm"]["series"][0]["measured"]}
    assert measured[128]["errors"] == {SGLANG_ARM: "StandIn: sgl_kernel.rmsnorm is a stand-in here"}
    assert measured[128]["ours"] is True  # SGLang's function did not run: ours
    assert "errors" not in measured[6]
    assert set(measured[256]["errors"]) == {SGLANG_ARM, OURS_ARM}


@pytest.mark.parametrize("fatal", [KeyboardInterrupt, SystemExit])
def test_time_sites_does_not_swallow_an_interrupt(fake_sites, monkeypatch, fatal):
    from dsv41_kernels import calibrate_cli

    def interrupted(fn, rows):
        raise fatal()

    monkeypatch.setattr(calibrate_cli, "_timed", interrupted)
    with pytest.raises(fatal):
        calibrate_cli.time_sites(None, 1)
