"""``dsv41-kernels``: the command line. ``check`` runs every op against its reference;
``calibrate`` decides where the SGLang plugin's hooks run on this GPU."""

from __future__ import annotations

import argparse
import json
import os
import sys

from dsv41_kernels import __version__


def _table(records: list[dict]) -> str:
    cols = ["op", "shape", "path", "reason", "exact", "mismatches", "us", "baseline_us", "module"]
    rows = [cols]
    for r in records:
        row = []
        for c in cols:
            v = r[c]
            if c == "exact":
                v = "yes" if v else "NO"
            elif c in ("us", "baseline_us"):
                v = "-" if v is None else f"{v:.2f}"
            elif c == "module":
                v = v or "-"
            row.append(str(v))
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def check(args: argparse.Namespace) -> int:
    if not _cuda_present():
        # Before any Triton kernel is defined: triton.jit reads it at decoration time. An
        # explicit TRITON_INTERPRET=0 keeps the fallbacks only.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from dsv41_kernels.check import cases, mode, op_names, run_case

    only = [name.strip() for name in args.ops.split(",") if name.strip()] if args.ops else None
    unknown = sorted(set(only or ()) - set(op_names()))
    if unknown:
        print(
            f"dsv41-kernels check: unknown op {', '.join(unknown)}; "
            f"valid names: {', '.join(op_names())}",
            file=sys.stderr,
        )
        return 2
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    where = torch.cuda.get_device_name() if on_gpu else "cpu"
    how = mode(device)
    timed = how == "cuda"
    records = []
    for case in cases(device, small=not timed, only=only):  # the interpreter: small shapes
        record = {**run_case(case, timed=timed), "device": where, "mode": how}
        records.append(record)
        if args.json:
            print(json.dumps(record), flush=True)
    if not args.json:
        times = "times are CUDA-graph medians in µs" if timed else "exactness only, no times"
        print(f"dsv41-kernels check on {where} ({how}): {times}")
        print(_table(records))
    inexact = [r for r in records if not r["exact"]]
    if inexact:
        print(f"{len(inexact)} of {len(records)} checks inexact", file=sys.stderr)
    return 1 if inexact or not records else 0


def _cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dsv41-kernels")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "check",
        help="run every op against its reference and print a table",
        description="Every op against its reference on the device present: CUDA, else the "
        "Triton interpreter on small shapes (TRITON_INTERPRET=0: the torch fallbacks only).",
    )
    p.add_argument("--json", action="store_true", help="one JSON record per line instead")
    p.add_argument("--ops", help="comma-separated op names to run (default: all)")
    from dsv41_kernels.calibrate_cli import add_parser

    add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "calibrate":
        from dsv41_kernels.calibrate_cli import calibrate

        return calibrate(args)
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
