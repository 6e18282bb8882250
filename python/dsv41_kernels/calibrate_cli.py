"""The ``calibrate`` subcommand: its options, the timing on the GPU, the policy file written.

On the GPU each call site is driven as its SGLang callers drive it, by the package's drivers
(:mod:`dsv41_kernels.calibration.drivers`, with SGLang 0.5.23 installed): every size of every
site, both arms (SGLang's own function with our hooks taken out, ours forced), ``--repeats``
times in turn, each a CUDA-graph median (:func:`dsv41_kernels.timing.graph_time_us`). One size's
inputs are built just before its timings and dropped after them. An arm that cannot run is a
record without a figure that says why (``error``). The records then go to
:func:`dsv41_kernels.calibrate.decide`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from dsv41_kernels.calibrate import MARGIN, decide, dumps, file_name
from dsv41_kernels.sglang_plugin.policy import POLICY_ENV, SITE_SWITCH, USER_DIR

REPEATS = 3
NO_CUDA = (
    "dsv41-kernels calibrate times SGLang's call sites on a CUDA GPU and none is here; "
    "run it on the GPU that serves (--from-records decides from existing records anywhere)"
)
NO_SGLANG = (
    "dsv41-kernels calibrate drives SGLang's call sites and needs SGLang 0.5.23 installed ({error})"
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="time the SGLang plugin's call sites on this GPU and write its policy",
        description="Time each hooked SGLang 0.5.23 call site, ours against SGLang's own "
        "function, and write the policy saying where ours runs on this GPU (default: "
        f"{USER_DIR}, which the plugin reads unless {POLICY_ENV} names another).",
    )
    p.add_argument("--sites", help="comma-separated call sites (default: all measured)")
    p.add_argument("--out", type=Path, help="the policy file or folder to write")
    p.add_argument("--json", action="store_true", help="print the policy as JSON on stdout")
    p.add_argument("--margin", type=float, default=MARGIN, help="how much faster ours must be")
    p.add_argument("--repeats", type=int, default=REPEATS, help="timings of each arm and size")
    p.add_argument(
        "--from-records",
        action="append",
        metavar="JSONL",
        help="decide from the call_sites records of a results file instead of timing",
    )
    p.add_argument("--sm-count", type=int, help="the GPU's SM count (with --from-records)")


def calibrate(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    from dsv41_kernels.calibrate import from_records

    sites = [s.strip() for s in args.sites.split(",") if s.strip()] if args.sites else None
    unknown = sorted(set(sites or ()) - set(SITE_SWITCH))
    if unknown:
        print(
            f"unknown call site {', '.join(unknown)}; valid: {', '.join(SITE_SWITCH)}",
            file=sys.stderr,
        )
        return 2
    if args.from_records:
        if args.sm_count is None:
            print("--from-records needs --sm-count (the records do not say it)", file=sys.stderr)
            return 2
        policy = from_records(args.from_records, args.margin, args.sm_count)
    else:
        import torch

        if not torch.cuda.is_available():
            print(NO_CUDA, file=sys.stderr)
            return 1
        try:
            records = time_sites(sites, args.repeats, started=started)
        except ImportError as e:
            print(NO_SGLANG.format(error=e), file=sys.stderr)
            return 1
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        policy = decide(
            records,
            args.margin,
            sm_count=props.multi_processor_count,
            source={"command": "dsv41-kernels " + " ".join(sys.argv[2:]).strip()},
        )
    if sites:
        policy["sites"] = {k: v for k, v in policy["sites"].items() if k in sites}
    out = args.out or USER_DIR
    path = out / file_name(policy["key"]) if out.is_dir() or out == USER_DIR else out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(policy))
    if args.json:
        print(json.dumps(policy))
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _timed(fn, rows: int) -> float:
    from dsv41_kernels.calibration.drivers import inner_calls
    from dsv41_kernels.timing import graph_time_us

    return graph_time_us(fn, inner=inner_calls(rows), repeats=10)


def _load_plugins() -> None:
    """SGLang's plugin loader, loading this plugin alone with ours forced at every size."""
    os.environ["SGLANG_PLUGINS"] = "dsv41_kernels"
    os.environ["DSV41_KERNELS_FORCE"] = "all"  # ours at every size, whatever a policy says
    from sglang.srt.plugins import load_plugins

    load_plugins()


def _machine(device) -> dict:
    """The fields of every record that name this machine and the run's date."""
    import importlib.metadata

    import torch

    props = torch.cuda.get_device_properties(device)
    return {
        "device": torch.cuda.get_device_name(device),
        "sm": f"sm_{props.major}{props.minor}",
        "sglang": importlib.metadata.version("sglang"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def time_sites(
    sites: list[str] | None, repeats: int, *, started: float | None = None
) -> list[dict]:
    """Every size of ``sites`` (None: every site the drivers know), each arm ``repeats`` times,
    as records for :func:`~dsv41_kernels.calibrate.decide`; a record without a figure says why
    in ``error``. One line on stderr gives the seconds from ``started`` (a
    :func:`time.perf_counter`; default: now) to the first timing and to the end."""
    started = time.perf_counter() if started is None else started
    import torch

    from dsv41_kernels.calibration.drivers import SITES, measure

    _load_plugins()
    device = torch.device("cuda")
    machine = _machine(device)
    timed = [s for s in SITES if s in SITE_SWITCH and (sites is None or s in sites)]
    untimed = sorted(set(sites or ()) - set(timed))
    if untimed:
        print(f"no driver times {', '.join(untimed)}: left out", file=sys.stderr)
    cases = [case for site in timed for case in SITES[site].cases(device)]  # no inputs yet
    progress = _progress(len(cases) * repeats * 2)
    first = None  # the seconds at which the first timing began

    def timer(fn, rows):
        nonlocal first
        if first is None:
            first = time.perf_counter() - started
        return _timed(fn, rows)

    records = []
    for case in cases:
        for arm, us, error in measure(case, timer, repeats):
            record = {"op": case.op, "shape": case.shape, "arm": arm, "us": us, "rows": case.rows}
            records.append(record | ({} if error is None else {"error": error}) | machine)
            progress(f"{case.op} {case.shape}")
    progress(None)
    total = time.perf_counter() - started
    before = "nothing timed" if first is None else f"{first:.1f} s before the first timing"
    print(f"calibrate: {before}, {total:.1f} s in all", file=sys.stderr)
    return records


def _progress(total: int):
    """A tqdm bar where tqdm imports, else nothing shown."""
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda _label: None
    bar = tqdm(total=total, unit="timing", file=sys.stderr)

    def step(label):
        if label is None:
            bar.close()
        else:
            bar.set_description(label[:40])
            bar.update()

    return step
