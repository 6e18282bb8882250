"""``dsv41-kernels calibrate``: time each hooked call site, ours against SGLang 0.5.23's own
function, and write the policy that says where ours runs (:mod:`.sglang_plugin.policy`).

The decision is :func:`decide`, a pure function of timing records, so that it is checked on a
CPU and can also take the records the call-site benchmark keeps (``--from-records``). A
record is one timing of one arm: ``op`` (the call site), ``arm`` (:data:`SGLANG_ARM` or
:data:`OURS_ARM`), ``rows``, ``us`` (None: the arm did not run), and for a site whose second
dimension decides (:data:`~.sglang_plugin.policy.COLUMNS`) ``columns`` (or the shape's
``o [T, H, D]``), plus the machine's ``device``, ``sm``, ``sglang``, ``torch``, ``cuda`` and the
run's ``date`` and ``commit``, and for an arm without a figure its ``error`` when known (the
policy's ``measured`` names it). Records of one site, size and arm are repeats, paired in order.

At one measured size ours wins when it is faster than SGLang's by at least ``margin`` in every
repeat, or when SGLang's function did not run there (ours is then the only path measured);
ours loses where it did not run or missed the margin once. Between two measured sizes ours
runs only when both won; below the smallest and above the largest the nearest one decides.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from dsv41_kernels.sglang_plugin.policy import COLUMNS, FORMAT, HARD_KEYS, SITE_SWITCH

SGLANG_ARM = "sglang-0.5.23"
OURS_ARM = "ours"
MARGIN = 0.03
BENCH = "call_sites"
_HEADS = re.compile(r"o \[\d+, (\d+),")


def current(records: Iterable[dict]) -> list[dict]:
    """The latest record of each (device, op, shape, arm), a timed one before one without a
    figure (``benchmark/report.py``'s rule): one repeat per size, as the results file keeps."""
    best = {}
    for i, r in enumerate(records):
        key = (r["device"], r["op"], r["shape"], r["arm"])
        rank = (r.get("us") is not None, r.get("date") or "", i)
        if key not in best or rank >= best[key][0]:
            best[key] = (rank, r)
    return [r for _, r in sorted(best.values(), key=lambda item: item[0][2])]


def columns_of(r: dict) -> int | None:
    if r["op"] not in COLUMNS:
        return None
    if r.get("columns") is not None:
        return int(r["columns"])
    found = _HEADS.search(r["shape"])
    if found is None:
        raise ValueError(f"{r['op']} record without its {COLUMNS[r['op']]}: {r['shape']!r}")
    return int(found.group(1))


def _us(values: list) -> str:
    return "/".join("-" if v is None else f"{v:.2f}" for v in values)


def _verdict(sglang: list, ours: list, margin: float) -> tuple[bool, str]:
    """(ours wins, the figures) at one size from its repeats."""
    figures = f"SGLang's {_us(sglang)} us, ours {_us(ours)} us"
    if not ours or any(v is None for v in ours):
        return False, f"ours did not run ({figures})"
    if all(v is None for v in sglang):
        return True, f"SGLang's function did not run ({figures})"
    pairs = list(zip(sglang, ours))
    wins = all(s is not None and o <= (1 - margin) * s for s, o in pairs)
    return wins, figures


def _ranges(points: list[tuple[int, bool, str]]):
    """Inclusive row ranges ``(first, last, ours, measured point's words)`` covering 0 and up:
    a gap between two sizes is ours only when both are; the ends extend the nearest size."""
    segments = []
    for i, (rows, win, words) in enumerate(points):
        if i == 0 and rows > 0:
            segments.append([0, rows - 1, win, None])
        segments.append([rows, rows, win, words])
        if i + 1 < len(points):
            after, after_win, _ = points[i + 1]
            if after > rows + 1:
                segments.append([rows + 1, after - 1, win and after_win, None])
        else:
            segments.append([rows + 1, None, win, None])
    merged = []
    for first, last, win, words in segments:
        if merged and merged[-1][2] == win:
            merged[-1][1] = last
            merged[-1][3] = merged[-1][3] or words
        else:
            merged.append([first, last, win, words])
    return merged


def _series(gpu: str, op: str, columns, by_rows: dict, errors: dict, margin: float) -> dict:
    points, measured = [], []
    for rows in sorted(by_rows):
        arms = by_rows[rows]
        sglang, ours = arms.get(SGLANG_ARM, []), arms.get(OURS_ARM, [])
        win, words = _verdict(sglang, ours, margin)
        where = f"{rows} rows" + ("" if columns is None else f", {columns} {COLUMNS[op]}")
        points.append((rows, win, f"{where}: {words}"))
        rounded = lambda values: [None if v is None else round(v, 2) for v in values]
        measured.append(
            {"rows": rows, "sglang_us": rounded(sglang), "ours_us": rounded(ours), "ours": win}
        )
        why = {arm: "; ".join(texts) for arm, texts in errors.get(rows, {}).items() if texts}
        if why:
            measured[-1]["errors"] = why
    ranges = _ranges(points)
    declined = [
        {
            "rows": [first, last],
            "why": f"{gpu}: not {margin:.0%} faster than SGLang's in every repeat at {words}",
        }
        for first, last, win, words in ranges
        if not win
    ]
    return {
        "columns": columns,
        "ours": [[first, last] for first, last, win, _ in ranges if win],
        "declined": declined,
        "measured": measured,
    }


def _one(records: list[dict], field: str):
    values = sorted({str(r.get(field)) for r in records if r.get(field) is not None})
    if len(values) > 1:
        raise ValueError(f"records of several {field}s: {', '.join(values)}; give one machine's")
    return values[0] if values else None


def decide(
    records: Iterable[dict],
    margin: float = MARGIN,
    *,
    sm_count: int,
    dsv41_kernels: str | None = None,
    source: dict | None = None,
) -> dict:
    """The policy (its JSON object) that ``records`` of one machine decide."""
    from dsv41_kernels import __version__

    records = [r for r in records if r["op"] in SITE_SWITCH and r["arm"] in (SGLANG_ARM, OURS_ARM)]
    if not records:
        raise ValueError("no call-site records of ours and SGLang's")
    key = {
        "gpu": _one(records, "device"),
        "sm": _one(records, "sm"),
        "sm_count": int(sm_count),
        "sglang": _one(records, "sglang"),
        "dsv41_kernels": dsv41_kernels or __version__,
        "torch": _one(records, "torch"),
        "cuda": _one(records, "cuda"),
    }
    missing = [name for name in HARD_KEYS if key[name] is None]
    if missing:
        raise ValueError(f"the records do not say the machine's {', '.join(missing)}")
    grouped = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    errors = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))  # each distinct once
    for r in records:
        series, rows = (r["op"], columns_of(r)), int(r["rows"])
        grouped[series][rows][r["arm"]].append(r.get("us"))
        seen = errors[series][rows][r["arm"]]
        if r.get("us") is None and r.get("error") and r["error"] not in seen:
            seen.append(r["error"])
    sites = {}
    for op in SITE_SWITCH:
        series = [
            _series(key["gpu"], op, columns, by_rows, errors[(site, columns)], margin)
            for (site, columns), by_rows in sorted(
                grouped.items(), key=lambda item: (item[0][0], item[0][1] or 0)
            )
            if site == op
        ]
        if series:
            sites[op] = {"switch": SITE_SWITCH[op], "columns": COLUMNS.get(op), "series": series}
    dates = sorted(r["date"] for r in records if r.get("date"))
    commits = sorted({r["commit"] for r in records if r.get("commit")})
    return {
        "format": FORMAT,
        "key": key,
        "margin": margin,
        "date": dates[-1] if dates else None,
        "source": {**(source or {}), "commits": commits},
        "unmeasured": [op for op in SITE_SWITCH if op not in sites],
        "sites": sites,
    }


def file_name(key: dict) -> str:
    """``policy-h200-sm_90-132sm-sglang0.5.23.json`` for the H200's key."""
    words = re.sub(r"[^a-z0-9]+", " ", key["gpu"].lower()).split()
    gpu = "_".join(w for w in words if w != "nvidia") or "gpu"
    return f"policy-{gpu}-{key['sm']}-{key['sm_count']}sm-sglang{key['sglang']}.json"


def dumps(policy: dict) -> str:
    """The policy as its file holds it: what fits on a line on one line, the rest indented."""
    return _dump(policy, "") + "\n"


def _dump(value, indent: str, width: int = 99) -> str:
    flat = json.dumps(value)
    if len(indent) + len(flat) <= width or not isinstance(value, (dict, list)) or not value:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_dump(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    items = [inner + _dump(v, inner) for v in value]
    return "[\n" + ",\n".join(items) + f"\n{indent}]"


def from_records(paths: list[str], margin: float, sm_count: int, device: str | None = None) -> dict:
    """The policy of the call-site records in ``paths`` (of ``device`` when given; a file must
    then hold one device's), each size's latest timed record of each arm."""
    records = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    records = [
        r
        for r in records
        if r.get("bench") == BENCH and (device is None or r.get("device") == device)
    ]
    command = " ".join(
        ["dsv41-kernels calibrate", *(f"--from-records {p}" for p in paths)]
        + [f"--sm-count {sm_count}"]
        + ([] if margin == MARGIN else [f"--margin {margin}"])
    )
    return decide(
        current(records),
        margin,
        sm_count=sm_count,
        source={"records": list(paths), "command": command},
    )
