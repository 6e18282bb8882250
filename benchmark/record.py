"""The results file: every benchmark's records, with what made them, one JSON object a line.

``--record [PATH]`` (every benchmark takes it) appends each record of the run to PATH, by
default the device's file in the results folder, docs/results (``NVIDIA H200`` ->
``h200.jsonl``; ``cpu.jsonl`` on a machine without a GPU). A record keeps the benchmark schema
(``op``, ``shape``, ``arm``, ``us``, ``device``: the GPU's name, and the op's own fields) and
gains the run's metadata:

- ``bench``: the benchmark that made it (``call_sites``, ``verify_cycle``, ``bench_row_argmax``);
- ``command``: its command line (``python -m benchmark.call_sites --record``);
- ``commit``: ``$DSV41_KERNELS_COMMIT`` where set (a copied tree, whose ``.git`` may be
  missing or another commit's), else ``git rev-parse --short HEAD`` (``+dirty`` with tracked
  files changed), else the package version;
- ``date``: UTC, ISO 8601, seconds;
- ``torch``, ``triton``, ``cuda`` (``torch.version.cuda``), ``sglang`` (its version where it
  is installed or imported, else null), ``python``, ``sm`` (``sm_90`` for the GPU, null on a CPU).

``python -m benchmark.report`` builds ``docs/performance.md``'s tables and the plots from these
files.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
META_KEYS = (
    "bench",
    "command",
    "commit",
    "date",
    "torch",
    "triton",
    "cuda",
    "sglang",
    "python",
    "sm",
)


def device_slug(device: str) -> str:
    """The results file's name for a device: ``NVIDIA H200`` -> ``h200``, ``cpu`` -> ``cpu``."""
    words = re.sub(r"[^a-z0-9]+", " ", device.lower()).split()
    return "_".join(w for w in words if w != "nvidia") or "cpu"


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--record [PATH]``: ``args.record`` is None (not asked), True (the default file) or PATH."""
    parser.add_argument(
        "--record",
        nargs="?",
        const=True,
        type=Path,
        metavar="PATH",
        help="append the records, with the run's metadata, to PATH "
        "(default: <device>.jsonl in docs/results)",
    )


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit() -> str:
    # Named first: a copied tree may carry a stale .git of some other commit.
    if os.environ.get("DSV41_KERNELS_COMMIT"):
        return os.environ["DSV41_KERNELS_COMMIT"]
    head = _git("rev-parse", "--short", "HEAD")
    if head:
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        return head + ("+dirty" if dirty else "")
    try:
        return importlib.metadata.version("dsv41-kernels")
    except importlib.metadata.PackageNotFoundError:
        from dsv41_kernels import __version__

        return __version__


def _version(package: str) -> str | None:
    module = sys.modules.get(package)
    if getattr(module, "__version__", None):
        return str(module.__version__)
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _sm() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def invocation() -> tuple[str, str]:
    """``(bench, command)`` of this process: ``-m`` module or script, and its arguments."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        name = spec.name.removesuffix(".__main__")
        bench, head = name.rsplit(".", 1)[-1], f"-m {name}"
    else:
        script = Path(sys.argv[0]).resolve()
        bench = script.stem
        head = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else sys.argv[0]
    return bench, " ".join(["python", head, *map(shlex.quote, sys.argv[1:])])


def metadata(bench: str | None = None, command: str | None = None) -> dict:
    """The run's metadata (:data:`META_KEYS`); ``bench`` and ``command`` default to this
    process's (:func:`invocation`)."""
    import torch

    found_bench, found_command = invocation()
    return {
        "bench": bench or found_bench,
        "command": command or found_command,
        "commit": commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "sglang": _version("sglang"),
        "python": platform.python_version(),
        "sm": _sm(),
    }


def default_path(device: str) -> Path:
    return RESULTS / f"{device_slug(device)}.jsonl"


def append(
    records: Iterable[dict],
    path: Path | bool,
    *,
    bench: str | None = None,
    command: str | None = None,
) -> Path | None:
    """Append ``records`` with the run's metadata to ``path`` (True: the device's default file).
    Returns the file written, None when there was nothing to write."""
    records = list(records)
    if not records:
        return None
    meta = metadata(bench, command)
    if path is True:
        path = default_path(records[0]["device"])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps({**r, **meta}) + "\n")
    print(f"appended {len(records)} records to {path}")
    return path


def read(paths: Iterable[Path]) -> list[dict]:
    """Every record of the given ``.jsonl`` files, in file then line order."""
    records = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records
