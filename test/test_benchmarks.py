"""The kernel benchmarks on a CPU: every script imports, and the shared harness keeps its schema.

The benchmarks themselves need a GPU (``benchmark/run_gpu.sh``); here each one is imported as
the script would run it (its folder first on the path, which is how ``import common`` resolves),
so a renamed op or a moved helper fails in CI, not on the H200. ``--record`` is checked here
end to end: the records it appends keep the schema and carry the run's metadata.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest
from benchmark import record as results

KERNELS = Path(__file__).resolve().parents[1] / "benchmark" / "kernels"
SCRIPTS = sorted(p.stem for p in KERNELS.glob("bench_*.py"))


@pytest.fixture(scope="module")
def on_script_path():
    sys.path.insert(0, str(KERNELS))
    yield
    sys.path.remove(str(KERNELS))


def test_one_benchmark_per_op():
    ops = {p.stem for p in Path(KERNELS.parents[1], "python/dsv41_kernels/cases").glob("*.py")}
    assert {f"bench_{op}" for op in ops - {"__init__", "common"}} <= set(SCRIPTS)


def test_run_gpu_runs_every_benchmark():
    """``benchmark/run_gpu.sh bench`` times every op's script (the sharded one by world)."""
    text = (KERNELS.parent / "run_gpu.sh").read_text()
    listed = set(re.search(r"for op in ([^;]*); do", text).group(1).replace("\\", " ").split())
    assert {s.removeprefix("bench_") for s in SCRIPTS} <= listed


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_imports(on_script_path, script):
    module = importlib.import_module(script)
    assert callable(module.main) and module.__doc__


def test_records_table_and_json(on_script_path, tmp_path):
    common = importlib.import_module("common")
    records = [
        common.record("op_a", "[6x8]", "baseline", 4.0, exact=True),
        common.record("op_a", "[6x8]", "ours", 2.0, exact=True, kernel="triton"),
        common.record("op_a", "[6x8]", common.SGLANG_ARM, None, error="not importable"),
    ]
    for r in records:
        assert set(common.KEYS) <= set(r)
    lines = common.table(records, baseline="baseline").splitlines()
    assert lines[0].split()[:5] == ["op", "shape", "arm", "us", "speedup"]
    assert lines[3].split()[2:5] == ["ours", "2.00", "2.00"]  # speedup 4.0 / 2.0
    assert "sglang-0.5.23" in lines[4] and " - " in lines[4]
    path = tmp_path / "out" / "bench.json"
    common.write_json(path, records)
    assert json.loads(path.read_text()) == {"records": records}


def test_first_call_summary_over_processes():
    sys.path.insert(0, str(KERNELS.parent))
    try:
        first_call = importlib.import_module("first_call")
    finally:
        sys.path.remove(str(KERNELS.parent))
    run = {"op": "row_argmax", "module": "row_argmax", "load_s": 0.01, "first_ms": 2.0}
    runs = [
        [{**run, "source": "built now", "load_s": 9.0, "second_ms": 0.03}],
        [{**run, "source": "cached", "second_ms": 0.05}],
    ]
    (row,) = first_call.summary(runs)
    assert row["sources"] == ["built now", "cached"] and row["processes"] == 2
    assert (row["max_load_s"], row["max_first_ms"], row["median_second_ms"]) == (9.0, 2.0, 0.04)
    line = first_call.table([row]).splitlines()[1]
    assert line.split()[:4] == ["row_argmax", "row_argmax", "built", "now,"]


@pytest.fixture
def common(on_script_path, monkeypatch):
    module = importlib.import_module("common")
    monkeypatch.setattr(module._Parser, "record_to", None)  # what a parse leaves behind
    return module


def test_device_slug():
    assert results.device_slug("NVIDIA H200") == "h200"
    assert results.device_slug("NVIDIA H100 80GB HBM3") == "h100_80gb_hbm3"
    assert results.device_slug("cpu") == "cpu"


def test_record_appends_the_schema_and_the_metadata(common, tmp_path, capsys):
    path = tmp_path / "r" / "cpu.jsonl"
    args = common.parser("x").parse_args(["--record", str(path), "--json", str(tmp_path / "j")])
    assert args.record == path
    records = [common.record("op_a", "[6x8]", common.OURS_ARM, 2.0, exact=True)]
    common.report(records, args.json)
    common.report(records, None)  # a second run appends
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2 and "appended 1 records" in capsys.readouterr().out
    r = lines[0]
    assert set(common.KEYS) | set(results.META_KEYS) <= set(r)
    assert (r["op"], r["us"], r["exact"], r["device"]) == ("op_a", 2.0, True, "cpu")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", r["date"])
    assert r["torch"] and r["python"] and r["command"].startswith("python ")
    assert r["sm"] is None and r["cuda"] is None  # a CPU build of torch, no GPU
    assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?|\d+\.\d+\.\d+.*", r["commit"])


def test_record_without_a_path_goes_to_the_devices_file(common, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    args = common.parser("x").parse_args(["--record"])
    assert args.record is True
    common.report([common.record("op_a", "[1]", "ours", 1.0)], None)
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.jsonl"]


def test_no_record_without_the_flag(common, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    common.parser("x").parse_args([])
    common.report([common.record("op_a", "[1]", "ours", 1.0)], None)
    assert not list(tmp_path.iterdir())


def test_commit_outside_a_checkout(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "ROOT", tmp_path)  # no .git there
    monkeypatch.setenv("DSV41_KERNELS_COMMIT", "abc1234+dirty")
    assert results.commit() == "abc1234+dirty"
    monkeypatch.delenv("DSV41_KERNELS_COMMIT")
    from dsv41_kernels import __version__

    assert results.commit() == __version__


def test_a_named_commit_wins_over_the_trees_git(monkeypatch):
    """A copied tree may hold another commit's .git: the commit named for the run wins."""
    monkeypatch.setenv("DSV41_KERNELS_COMMIT", "0123abc")
    assert results.commit() == "0123abc"


@pytest.mark.parametrize("module", ["call_sites", "verify_cycle"])
def test_call_site_benchmarks_take_record(module, monkeypatch):
    bench = importlib.import_module(f"benchmark.{module}")
    monkeypatch.setattr(sys, "argv", [module, "--record", "x.jsonl", "--json", "x.json"])
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):  # the arguments parsed
        bench.main()
