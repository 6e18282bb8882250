"""The kernel benchmarks on a CPU: every script imports, and the shared harness keeps its schema.

The benchmarks themselves need a GPU (``benchmark/run_gpu.sh``); here each one is imported as
the script would run it (its folder first on the path, which is how ``import common`` resolves),
so a renamed op or a moved helper fails in CI, not on the H200.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

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
