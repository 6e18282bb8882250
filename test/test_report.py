"""``python -m benchmark.report``: the tables and plots from the results files, on a CPU.

A tiny results file in a temporary folder gives known tables; the real docs/performance.md must
be what the real results files give (``--check``), and their folder, docs/results, stays small.
"""

from __future__ import annotations

import json
import re

import pytest
from benchmark import record as results
from benchmark import report

DOC = """# Performance

<!-- report:begin verify_cycle -->
stale
<!-- report:end -->

text between

<!-- report:begin call_sites -->
<!-- report:end -->

<!-- report:begin kernels -->
<!-- report:end -->
"""


def rec(op, shape, arm, us, *, bench, date="2026-12-01T00:00:00+00:00", **fields):
    meta = {"bench": bench, "command": f"python -m benchmark.{bench} --record", "date": date}
    meta |= {"commit": "abc1234", "torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0"}
    meta |= {"sglang": "0.5.23", "python": "3.12", "sm": "sm_90"}
    return {
        "op": op,
        "shape": shape,
        "arm": arm,
        "us": us,
        "device": "NVIDIA H200",
        **fields,
        **meta,
    }


def tiny_results():
    later = "2026-12-02T00:00:00+00:00"
    records = []
    for rows, base, ours in ((1, 3.0, 2.0), (64, 10.0, 5.0)):
        site = {"call_site": "dspark_accept._row_argmax(fused=True)", "rows": rows}
        shape = f"[{rows}, 129280]"
        records += [rec("row_argmax", shape, "sglang-0.5.23", base, bench="call_sites", **site)]
        records += [rec("row_argmax", shape, "ours", ours, bench="call_sites", **site)]
    # a later run of one shape replaces that shape's record only
    site = {"call_site": "dspark_accept._row_argmax(fused=True)", "rows": 64}
    records += [
        rec("row_argmax", "[64, 129280]", "ours", 4.0, bench="call_sites", date=later, **site)
    ]
    for tp in (1, 4):
        shape, wo_a = f"T 6, TP {tp}", {"rows": 6, "series": f"TP {tp}", "call_site": "wo_a"}
        records += [
            rec(
                "inverse_rope_quant_fp8",
                shape,
                "sglang-0.5.23",
                2.0 * tp,
                bench="call_sites",
                **wo_a,
            )
        ]
        records += [
            rec("inverse_rope_quant_fp8", shape, "ours", 1.0 * tp, bench="call_sites", **wo_a)
        ]
    for arm, us in (("sglang-0.5.23", 100.0), ("ours", 60.0)):
        records += [
            rec(
                "hc_mix_stats",
                "80 x [6, 4, 5120]",
                arm,
                us,
                bench="verify_cycle",
                call_site="mHC mix_stats",
                per_cycle=80,
            )
        ]
        whole = {"call_site": "the groups", "per_cycle": 1, "groups": ["hc_mix_stats"]}
        records += [rec("verify cycle", "BS 1", arm, us + 1, bench="verify_cycle", **whole)]
    bench = "bench_moe_fused_gate"  # its arm of ours is named otherwise
    for t in (1, 6):
        shape = f"[{t}, 384] float32 top-6"
        records += [rec("moe_fused_gate", shape, "sglang-0.5.23", 3.0, bench=bench)]
        records += [rec("moe_fused_gate", shape, "packed router", 2.0, bench=bench, kernel="cuda")]
        records += [rec("moe_fused_gate", shape, "router + pack", 9.0, bench=bench)]
    bench = "bench_mxfp8_quantize"  # SGLang's arm never ran
    why = "SGLang does not import here: no flashinfer"
    records += [
        rec("mxfp8_quantize", "[6, 5120] bf16", "sglang-0.5.23", None, bench=bench, error=why)
    ]
    records += [rec("mxfp8_quantize", "[6, 5120] bf16", "ours", 1.5, bench=bench)]
    return records


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "h200.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tiny_results()))
    doc = tmp_path / "performance.md"
    doc.write_text(DOC)
    return tmp_path, doc


def table_row(text, label):
    return next(line for line in text.splitlines() if line.startswith(f"| {label} |"))


def test_report_writes_the_tables_and_the_plots(tiny):
    folder, doc = tiny
    args = ["--results", str(folder), "--doc", str(doc)]
    assert report.main(args) == 0
    text = doc.read_text()
    assert "stale" not in text and "text between" in text
    assert "#### `row_argmax` at `dspark_accept._row_argmax(fused=True)`" in text
    assert table_row(text, "rows").split("|")[2:4] == [" 1 ", " 64 "]
    assert table_row(text, "ours µs") == "| ours µs | 2.00 | 4.00 |"  # the later record
    assert table_row(text, "SGLang / ours") == "| SGLang / ours | 1.50 | 2.50 |"
    assert "| TP 4: ours µs | 4.00 |" in text and "| TP 1: SGLang / ours | 2.00 |" in text
    assert "| mHC mix_stats | `hc_mix_stats` | 80 | 100.00 | 60.00 | 40.00 | 1.67 |" in text
    assert "| **the groups** |  | **1** | **101.00** | **61.00** | **40.00** | **1.66** |" in text
    moe = text[text.index("#### `moe_fused_gate`") :]
    assert table_row(moe, "ours µs") == "| ours µs | 2.00 | 2.00 |"  # "packed router"
    mxfp8 = text[text.index("#### `mxfp8_quantize`") :]
    assert "SGLang 0.5.23 µs" not in mxfp8 and "did not run: SGLang does not import" in mxfp8
    assert "- `python -m benchmark.call_sites --record` at `abc1234`, 2026-12-02" in text
    assert "torch 2.11.0+cu130, Triton 3.6.0, CUDA 13.0, SGLang 0.5.23" in text
    pngs = sorted(p.name for p in folder.glob("*.png"))
    assert pngs == ["h200_call_sites.png", "h200_kernels.png", "h200_verify_cycle.png"]
    for name in pngs:
        assert f"(results/{name})" in text
        assert (folder / name).read_bytes()[:4] == b"\x89PNG"
    assert report.main([*args, "--check"]) == 0
    doc.write_text(text.replace("| 4.00 |", "| 4.01 |"))
    assert report.main([*args, "--check"]) == 1


def test_current_takes_the_latest_record_of_each_key():
    records = tiny_results()
    chosen = report.current(records)
    ours_64 = [r for r in chosen if r["op"] == "row_argmax" and r["shape"] == "[64, 129280]"]
    assert [(r["arm"], r["us"]) for r in ours_64] == [("sglang-0.5.23", 10.0), ("ours", 4.0)]
    assert len(chosen) == len(records) - 1


def test_a_document_without_the_markers_is_refused(tiny):
    folder, doc = tiny
    doc.write_text("# Performance\n")
    with pytest.raises(SystemExit, match="report:begin verify_cycle"):
        report.main(["--results", str(folder), "--doc", str(doc), "--no-plots"])


def test_performance_md_is_what_the_results_give():
    assert report.main(["--check"]) == 0, "run python -m benchmark.report"


def test_results_folder_stays_small_and_its_plots_are_linked():
    files = sorted(p.name for p in results.RESULTS.iterdir())
    assert len(files) <= 10, files
    assert all(re.fullmatch(r"[a-z0-9_]+(\.jsonl|_[a-z_]+\.png)", name) for name in files), files
    text = report.DOC.read_text()
    for name in re.findall(r"\(results/([^)]+\.png)\)", text):
        assert name in files
    for path in results.RESULTS.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            assert {"op", "shape", "arm", "us", "device", *results.META_KEYS} <= set(r), r
