"""The first call of each op that runs a CUDA module, in fresh processes started at once.

A server process pays, on its first call of such an op, for getting the module: a load of the
prebuilt file, a load from the just-in-time cache, or a build (seconds a module, in every
process of a TP group at once). Each process here takes every op's first
check case that runs a CUDA module (``dsv41-kernels check``'s shapes) and times the module's
load (:func:`dsv41_kernels.jit.load_module`, once per module and process: an op whose module
an earlier op loaded shows ~0), then the first call and a second one. The parent starts
``--processes`` of them together, so that they reach the same modules at once, and fails if
any process fails or, with ``--expect``, takes a module from anywhere else.

Run on a GPU from the repository root, in the environment to measure: ``benchmark/
prebuilt_h200.sh`` runs it without nvcc on the prebuilt wheel, then on a cold cache with nvcc.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def first_calls() -> list[dict]:
    """This process's records: per op, its module's load and its first and second calls."""
    import torch

    from dsv41_kernels.check import CASE_MODULES
    from dsv41_kernels.jit import load_module, module_source

    device = torch.device("cuda")
    records = []
    for cases in CASE_MODULES:
        case = next((c for c in cases.check_cases(device, small=False) if c.admission.module), None)
        if case is None:
            continue
        module = case.admission.module
        times = []
        for step in (lambda: load_module(module, torch.cuda.current_device()), case.run, case.run):
            torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        records.append(
            {
                "op": case.op,
                "shape": case.shape,
                "module": module,
                "source": module_source(module),
                "load_s": times[0],
                "first_ms": times[1] * 1e3,
                "second_ms": times[2] * 1e3,
            }
        )
    return records


def summary(runs: list[list[dict]]) -> list[dict]:
    """Per op over the processes: the sources seen, the slowest load and first call, and the
    median second call."""
    ops: dict[str, list[dict]] = {}
    for records in runs:
        for r in records:
            ops.setdefault(r["op"], []).append(r)
    return [
        {
            "op": op,
            "module": rs[0]["module"],
            "sources": sorted({r["source"] for r in rs}),
            "processes": len(rs),
            "max_load_s": max(r["load_s"] for r in rs),
            "max_first_ms": max(r["first_ms"] for r in rs),
            "median_second_ms": statistics.median(r["second_ms"] for r in rs),
        }
        for op, rs in ops.items()
    ]


def table(rows: list[dict]) -> str:
    cells = [list(rows[0])] + [
        [
            ", ".join(v) if isinstance(v, list) else f"{v:.3f}" if isinstance(v, float) else str(v)
            for v in row.values()
        ]
        for row in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=1, help="started at once (default 1)")
    parser.add_argument(
        "--expect", help="where every module must come from, e.g. prebuilt ('a,b': either)"
    )
    parser.add_argument("--json", type=Path, help="write every process's records here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(first_calls()))
        return 0
    start = time.perf_counter()
    workers = [
        subprocess.Popen([sys.executable, __file__, "--worker"], stdout=subprocess.PIPE, text=True)
        for _ in range(args.processes)
    ]
    outputs = [w.communicate()[0] for w in workers]
    wall = time.perf_counter() - start
    failed = [i for i, w in enumerate(workers) if w.returncode != 0]
    runs = [json.loads(out) for i, out in enumerate(outputs) if i not in failed]
    rows = summary(runs) if runs else []
    print(f"{args.processes} processes started at once, all done in {wall:.1f} s")
    if rows:
        print(table(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"wall_s": wall, "runs": runs}, indent=1) + "\n")
    allowed = set(args.expect.split(",")) if args.expect else None
    unexpected = [r for r in rows if allowed and not set(r["sources"]) <= allowed]
    for r in unexpected:
        print(f"{r['op']}: module from {r['sources']}, expected {args.expect}", file=sys.stderr)
    if failed:
        print(f"processes {failed} failed", file=sys.stderr)
    return 1 if failed or unexpected or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
