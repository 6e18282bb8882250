"""``dsv41-kernels check``: the table, the JSON records, and the exit status."""

import json
import warnings

import pytest
import torch

import dsv41_kernels
from dsv41_kernels import check as check_module
from dsv41_kernels import cli
from dsv41_kernels.admission import admit, refuse
from dsv41_kernels.cases.common import CheckCase, bit_mismatches
from dsv41_kernels.check import run_case

KEYS = {
    "op",
    "shape",
    "path",
    "module",
    "reason",
    "exact",
    "mismatches",
    "us",
    "baseline_us",
    "device",
    "mode",
}


def test_json_records_for_one_op(capsys):
    assert cli.main(["check", "--json", "--ops", "row_argmax,accept_greedy"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["op"] for r in records} == {"row_argmax", "accept_greedy"}
    for r in records:
        assert set(r) == KEYS
        assert r["exact"] is True and r["mismatches"] == 0
        assert r["path"] in ("kernel", "fallback")
        if not torch.cuda.is_available():
            assert r["us"] is None and r["baseline_us"] is None


def test_table(capsys):
    assert cli.main(["check", "--ops", "row_argmax"]) == 0
    out = capsys.readouterr().out
    assert "dsv41-kernels check on" in out
    assert out.splitlines()[1].split()[:4] == ["op", "shape", "path", "reason"]


def _case(ours, ref):
    return CheckCase("fake", "[3]", admit("test"), lambda: ours, lambda: ref, bit_mismatches)


def test_inexact_case_fails_the_run(monkeypatch, capsys):
    bad = _case(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.5, 3.0]))
    monkeypatch.setattr(check_module, "cases", lambda device, small, only=None: [bad])
    assert cli.main(["check", "--json"]) == 1
    record = json.loads(capsys.readouterr().out)
    assert record["exact"] is False and record["mismatches"] == 1


def test_the_module_column_says_where_the_cuda_module_came_from(monkeypatch):
    monkeypatch.setattr(check_module, "module_source", {"row_argmax": "prebuilt"}.get)
    ran = torch.zeros(1)
    cuda = CheckCase(
        "fake", "[1]", admit("cuda", module="row_argmax"), lambda: ran, lambda: ran, bit_mismatches
    )
    assert run_case(cuda, timed=False)["module"] == "prebuilt"
    assert run_case(_case(ran, ran), timed=False)["module"] is None


def test_a_raising_op_is_reported_not_fatal():
    def boom():
        raise ValueError("no")

    case = CheckCase("fake", "[1]", refuse("cpu"), boom, lambda: torch.zeros(1), bit_mismatches)
    record = run_case(case, timed=False)
    assert record["exact"] is False and "ValueError: no" in record["reason"]
    assert record["path"] == "fallback"


def test_bit_mismatches_sees_nan_payloads_and_signed_zeros():
    a = torch.tensor([float("nan"), 0.0, 1.0])
    b = a.clone()
    assert bit_mismatches(a, b) == 0
    b[1] = -0.0
    assert bit_mismatches(a, b) == 1  # -0 and +0 compare equal, their bits do not
    b.view(torch.int32)[0] = 0x7FC00001  # another NaN
    assert bit_mismatches(a, b) == 2
    assert bit_mismatches((a, a), (a, b)) == 2
    assert bit_mismatches(a, a[:2]) == 3  # a shape mismatch counts every element


def test_every_op_module_registers_cases():
    small = check_module.cases(torch.device("cpu"), small=True)
    ops = {c.op for c in small}
    for expected in (
        "row_argmax",
        "accept_greedy",
        "decoding_sched_meta",
        "mxfp8_quantize",
        "hc_combine_norm",
        "hc_combine_norm_mxfp8",
        "moe_fused_gate",
        "hc_mix_stats",
        "hc_boundary",
        "pack_topk",
        "split_tf32",
    ):
        assert expected in ops
    assert ops == set(check_module.op_names())


def test_jit_says_what_is_missing(monkeypatch, tmp_path):
    """No prebuilt module, an empty cache and no nvcc: the error says nvcc is missing."""
    from dsv41_kernels import jit

    monkeypatch.setattr(jit, "PREBUILT", tmp_path / "prebuilt")
    monkeypatch.setattr(jit, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(jit, "device_arch", lambda device_index: "9.0a")
    monkeypatch.setattr(jit, "toolchain_available", lambda: False)
    jit.prebuilt_manifest.cache_clear()
    jit.load_module.cache_clear()
    with pytest.raises(RuntimeError, match="nvcc"):
        jit.load_module("row_argmax")
    jit.load_module.cache_clear()
    jit.prebuilt_manifest.cache_clear()


@pytest.mark.parametrize("ops, unknown", [("foo", "foo"), ("row_argmax,mxfp8", "mxfp8")])
def test_unknown_op_names_exit_2_and_list_the_valid_ones(capsys, ops, unknown):
    assert cli.main(["check", "--ops", ops]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no table, not even an empty one
    assert f"unknown op {unknown};" in captured.err
    for name in check_module.op_names():
        assert name in captured.err


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"dsv41-kernels {dsv41_kernels.__version__}"


def test_no_interpret_is_gone():
    """Removed rather than half-honoured: TRITON_INTERPRET=0 asks for the fallbacks only."""
    with pytest.raises(SystemExit) as done:
        cli.main(["check", "--no-interpret"])
    assert done.value.code == 2


def test_records_and_header_say_device_and_mode(capsys):
    assert cli.main(["check", "--json", "--ops", "row_argmax"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    on_gpu = torch.cuda.is_available()
    expected = check_module.mode(torch.device("cuda" if on_gpu else "cpu"))
    assert {(r["device"], r["mode"]) for r in records} == {
        (torch.cuda.get_device_name() if on_gpu else "cpu", expected)
    }
    assert cli.main(["check", "--ops", "row_argmax"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert f"({expected})" in header
    assert ("CUDA-graph medians" in header) == (expected == "cuda")


def test_pack_topk_and_split_tf32_have_rows(capsys):
    assert cli.main(["check", "--json", "--ops", "pack_topk,split_tf32"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["op"] for r in records} == {"pack_topk", "split_tf32"}
    assert all(r["exact"] for r in records)


def test_check_warns_about_nothing(capsys):
    """Every op's check cases, Inf and NaN inputs included, reach the caller without numpy's
    RuntimeWarnings: the interpreter computes in numpy, where ``inf * 0`` warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert cli.main(["check"]) == 0
