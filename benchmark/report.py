"""docs/performance.md's tables and the plots, from the results files (docs/results, ``*.jsonl``).

For each (device, bench, op, shape, arm) the latest record (by ``date``, then by its place in
the file; one with a figure before one without) is the current one. The generated parts of
docs/performance.md lie between marker lines, ``<!-- report:begin NAME -->`` and
``<!-- report:end -->``, for NAME in :data:`BLOCKS`:

- ``verify_cycle``: the verify cycle per call site (``benchmark/verify_cycle.py``);
- ``call_sites``: every hooked call site, SGLang 0.5.23's function against ours, per row count
  (``benchmark/call_sites.py``);
- ``kernels``: each op's benchmark (``benchmark/kernels/bench_<op>.py``), SGLang 0.5.23's
  kernel against ours, per shape.

The plots (matplotlib, ``pip install dsv41-kernels[bench]``) go to
``<device>_{verify_cycle,call_sites,kernels}.png`` in docs/results.

    python -m benchmark.report            # rewrite the tables and the plots
    python -m benchmark.report --check    # exit 1 if docs/performance.md's tables are stale
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

from benchmark import record as results

DOC = results.ROOT / "docs" / "performance.md"
BLOCKS = ("verify_cycle", "call_sites", "kernels")
BEGIN = "<!-- report:begin {} -->"
END = "<!-- report:end -->"
SGLANG = "sglang-0.5.23"
OURS = "ours"
WHOLE_CYCLE = "verify cycle"
OURS_ARM_OF = {"moe_fused_gate": "packed router", "sharded_row_argmax local": "ours (keys + merge)"}
"""Where an op's benchmark names our arm otherwise: the arm that does what SGLang's arm does."""
KERNEL_BENCHES = (
    "bench_row_argmax",
    "bench_accept_greedy",
    "bench_sharded_row_argmax",
    "bench_hc_mix_stats",
    "bench_hc_combine_norm",
    "bench_moe_fused_gate",
    "bench_decoding_sched_meta",
    "bench_inverse_rope_quant_fp8",
    "bench_mxfp8_quantize",
)
"""The kernel benchmarks' order in the tables; others follow, by name."""
_INT = re.compile(r"\d+")


def current(records: list[dict]) -> list[dict]:
    """The latest record of each (device, bench, op, shape, arm), in the order of each key's
    first record. A record with a figure beats one without (an arm that could not run in the
    latest environment, e.g. SGLang's tilelang path, keeps its last figure and its commit)."""
    best, first = {}, {}
    for i, r in enumerate(records):
        key = (r["device"], r.get("bench"), r["op"], r["shape"], r["arm"])
        first.setdefault(key, i)
        rank = (r.get("us") is not None, r.get("date") or "", i)
        if key not in best or rank >= best[key][0]:
            best[key] = (rank, r)
    return [best[k][1] for k in sorted(best, key=first.get)]


def latest_verify_groups(raw: list[dict], records: list[dict]) -> list[dict]:
    """``records`` less the verify-cycle groups that the latest verify_cycle run of their device
    did not time (a group the cycle no longer has, e.g. one that a fused group replaced). A
    run's records share its date."""
    latest: dict[str, str] = {}
    for r in raw:
        if r.get("bench") == "verify_cycle":
            latest[r["device"]] = max(latest.get(r["device"], ""), r.get("date") or "")
    timed = {
        (r["device"], r["op"])
        for r in raw
        if r.get("bench") == "verify_cycle" and (r.get("date") or "") == latest[r["device"]]
    }
    return [
        r for r in records if r.get("bench") != "verify_cycle" or (r["device"], r["op"]) in timed
    ]


def _x(r: dict):
    """The record's place on a table's columns and a plot's x axis: ``rows``, else the shape's
    first integer, else the shape."""
    if isinstance(r.get("rows"), int):
        return r["rows"]
    found = _INT.search(r["shape"])
    return int(found.group()) if found else r["shape"]


def _series(r: dict) -> str:
    """The shapes that share a line: ``series``, else the shape with its first integer made
    ``·`` (``[·, 129280] fp32``)."""
    if r.get("series") or "rows" in r:
        return r.get("series") or ""
    found = _INT.search(r["shape"])
    return r["shape"][: found.start()] + "·" + r["shape"][found.end() :] if found else ""


def _x_label(r: dict) -> str:
    found = _INT.search(r["shape"])
    if "rows" in r or not found:
        return "rows"
    words = r["shape"][: found.start()].strip(" =[(").split()
    return words[-1] if words else "rows"


def _us(us) -> str:
    return "–" if us is None else f"{us:.2f}"


def _ratio(base, ours) -> str:
    return "–" if not base or not ours else f"{base / ours:.2f}"


def _ours_arm(op: str, records: list[dict]) -> str:
    if any(r["arm"] == OURS for r in records):
        return OURS
    return OURS_ARM_OF.get(op, OURS)


def _by(records, *keys) -> dict:
    grouped: dict = {}
    for r in records:
        grouped.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return grouped


def _runs(records: list[dict]) -> list[tuple]:
    """The (command, commit, day) of the runs that made ``records``, in order."""
    keys = ("command", "commit", "date")
    found = (tuple(r.get(k) or "?" for k in keys) for r in records)
    return list(dict.fromkeys((cmd, commit, date[:10]) for cmd, commit, date in found))


def _sources(ops: dict, *, named: bool = True) -> list[str]:
    """The runs that made the tables, each with the ops whose records it made (``named``)."""
    made: dict = {}
    for op, records in ops.items():
        for run in _runs(records):
            made.setdefault(run, []).append(f"`{op}`")
    lines = ["Records:", ""]
    for (cmd, commit, day), names in made.items():
        lines.append(f"- `{cmd}` at `{commit}`, {day}" + (f": {', '.join(names)}" if named else ""))
    return [*lines, ""]


def _environment(device: str, records: list[dict]) -> str:
    def seen(key):
        return " / ".join(dict.fromkeys(str(r.get(key)) for r in records if r.get(key)))

    sm = seen("sm")
    parts = [f"torch {seen('torch')}", f"Triton {seen('triton')}", f"CUDA {seen('cuda')}"]
    if seen("sglang"):
        parts.append(f"SGLang {seen('sglang')}")
    return f"{device}{f' ({sm})' if sm else ''}: {', '.join(parts)}; CUDA-graph replay medians."


def _op_table(op: str, records: list[dict], caption: str) -> list[str]:
    """One op across its shapes: a column per shape; rows SGLang's µs, ours and their ratio,
    one set per series (SGLang's left out where its arm never ran, saying why)."""
    ours_arm = _ours_arm(op, records)
    mine = [r for r in records if r["arm"] in (SGLANG, ours_arm)]
    columns = list(dict.fromkeys(_x(r) for r in mine))
    if all(isinstance(c, int) for c in columns):
        columns.sort()
    if any("series" in r for r in mine):
        groups = _by(mine, "series")
    else:
        groups = _by([{**r, "_s": _series(r)} for r in mine], "_s")
    sglang_ran = any(r["us"] is not None for r in mine if r["arm"] == SGLANG)
    if len(groups) == 1 and next(iter(groups))[0]:
        caption += f", `{next(iter(groups))[0]}`"
    lines = [f"#### {caption}", "| " + " | ".join([_x_label(mine[0]), *map(str, columns)]) + " |"]
    lines.append("|---" + "|--:" * len(columns) + "|")
    for (name,), rs in groups.items():
        at = {(_x(r), r["arm"]): r["us"] for r in rs}
        prefix = f"{name}: " if name and len(groups) > 1 else ""
        cells = {
            "SGLang 0.5.23 µs": [_us(at[c, SGLANG]) if (c, SGLANG) in at else "" for c in columns],
            "ours µs": [_us(at[c, ours_arm]) if (c, ours_arm) in at else "" for c in columns],
            "SGLang / ours": [_ratio(at.get((c, SGLANG)), at.get((c, ours_arm))) for c in columns],
        }
        for label, row in cells.items():
            if sglang_ran or label == "ours µs":
                lines.append("| " + " | ".join([prefix + label, *row]) + " |")
    lines.append("")
    if not sglang_ran:
        why = next((r.get("error") for r in mine if r["arm"] == SGLANG and r.get("error")), None)
        lines += [f"SGLang 0.5.23's arm did not run{f': {why}' if why else ''}.", ""]
    return lines


def _ops(records: list[dict]) -> dict:
    """Ops with a timed SGLang or ours record, in order."""
    ops = _by(records, "op")
    return {
        op: rs
        for (op,), rs in ops.items()
        if any(r["us"] is not None and r["arm"] in (SGLANG, _ours_arm(op, rs)) for r in rs)
    }


def _kernel_benches(benches: set) -> list:
    return [b for b in KERNEL_BENCHES if b in benches] + sorted(
        b for b in benches if b and b.startswith("bench_") and b not in KERNEL_BENCHES
    )


def _images(slug: str, name: str, what: str) -> list[str]:
    return [f"![{what}](results/{slug}_{name}.png)", ""]


def block(name: str, records: list[dict]) -> str:
    """The generated text of one block of docs/performance.md, every device's."""
    lines = []
    devices = _by(records, "device")
    for (device,), mine in sorted(devices.items()):
        slug = results.device_slug(device)
        if len(devices) > 1:
            lines += [f"### {device}", ""]
        if name == "verify_cycle":
            chosen = [r for r in mine if r.get("bench") == "verify_cycle"]
            if chosen:
                lines += [_environment(device, chosen), ""]
                lines += _verify_table(chosen) + _images(slug, name, f"verify cycle, {device}")
        elif name == "call_sites":
            chosen = [r for r in mine if r.get("bench") == "call_sites"]
            if chosen:
                lines += [_environment(device, chosen), ""]
                lines += _images(slug, name, f"call sites, {device}")
                ops = _ops(chosen)
                for op, rs in ops.items():
                    lines += _op_table(op, rs, _site(op, rs))
                lines += _sources(ops)
        else:
            benches = _kernel_benches({r.get("bench") for r in mine})
            chosen = [r for r in mine if r.get("bench") in benches]
            if chosen:
                lines += [_environment(device, chosen), ""]
                lines += _images(slug, name, f"kernels, {device}")
            ops = {}
            for bench in benches:
                for op, rs in _ops([r for r in chosen if r.get("bench") == bench]).items():
                    lines += _op_table(op, rs, f"`{op}` (`benchmark/kernels/{bench}.py`)")
                    ops[op] = [r for r in rs if r["arm"] in (SGLANG, _ours_arm(op, rs))]
            if ops:
                lines += _sources(ops)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def _site(op: str, records: list[dict]) -> str:
    site = next((r["call_site"] for r in records if r.get("call_site")), None)
    if site is None:
        return f"`{op}`"
    return f"`{op}` at " + (f"`{site}`" if " " not in site else site)


def _verify_table(records: list[dict]) -> list[str]:
    lines = [
        "| call site | op | per cycle | SGLang 0.5.23 µs | ours µs | saving µs | SGLang / ours |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    groups = sorted(_by(records, "op").items(), key=lambda item: item[0][0] == WHOLE_CYCLE)
    for (op,), rs in groups:
        at = {r["arm"]: r for r in rs}
        base, ours = (at.get(arm, {}).get("us") for arm in (SGLANG, OURS))
        saving = "–" if base is None or ours is None else f"{base - ours:.2f}"
        site = next((r.get("call_site") for r in rs if r.get("call_site")), op)
        cells = [site, f"`{op}`" if op != WHOLE_CYCLE else "", str(rs[0].get("per_cycle", ""))]
        cells += [_us(base) if base is not None else "not run", _us(ours), saving]
        cells.append(_ratio(base, ours))
        if op == WHOLE_CYCLE:
            cells = [f"**{c}**" if c else c for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, "", *_sources({WHOLE_CYCLE: records}, named=False)]


def render(doc: str, records: list[dict]) -> str:
    """``doc`` with every block's text between its markers replaced by :func:`block`'s."""
    for name in BLOCKS:
        begin = BEGIN.format(name)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(END), re.S)
        if not pattern.search(doc):
            raise SystemExit(f"{DOC.name}: no '{begin}' ... '{END}' block")
        text = block(name, records)
        doc = pattern.sub(lambda _: f"{begin}\n{text}\n{END}", doc, count=1)
    return doc


def plot(records: list[dict], out_dir: Path) -> list[Path]:
    """The PNGs of every device: the verify cycle (bars), the call sites and the kernels (µs
    against the shape, ours and SGLang's, a subplot per op)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for (device,), mine in _by(records, "device").items():
        slug = results.device_slug(device)
        verify = [r for r in mine if r.get("bench") == "verify_cycle"]
        if verify:
            written.append(_plot_verify(plt, verify, out_dir / f"{slug}_verify_cycle.png", device))
        sites = _ops([r for r in mine if r.get("bench") == "call_sites"])
        if sites:
            path = out_dir / f"{slug}_call_sites.png"
            written.append(_plot_ops(plt, sites, path, f"{device}: SGLang 0.5.23's call sites"))
        benches = _kernel_benches({r.get("bench") for r in mine})
        kernels = {}
        for bench in benches:
            kernels.update(_ops([r for r in mine if r.get("bench") == bench]))
        if kernels:
            path = out_dir / f"{slug}_kernels.png"
            written.append(_plot_ops(plt, kernels, path, f"{device}: kernel benchmarks"))
    return written


def _plot_ops(plt, ops: dict, path: Path, title: str) -> Path:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    cols = 3 if len(ops) > 4 else 2
    rows = -(-len(ops) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, (op, rs) in zip(axes.flat, ops.items()):
        ours_arm = _ours_arm(op, rs)
        numeric = all(isinstance(_x(r), int) for r in rs)
        groups = _by([{**r, "_s": r.get("series") or _series(r)} for r in rs], "_s")
        for k, ((name,), group) in enumerate(groups.items()):
            for arm, style in ((SGLANG, "--"), (ours_arm, "-")):
                pts = [(_x(r), r["us"]) for r in group if r["arm"] == arm and r["us"] is not None]
                if not pts:
                    continue
                label = "SGLang 0.5.23" if arm == SGLANG else "ours"
                label += f", {name}" if name and len(groups) > 1 else ""
                xs, ys = zip(*(sorted(pts) if numeric else [(str(x), us) for x, us in pts]))
                color = f"C{k}" if len(groups) > 1 else ("C0" if arm == SGLANG else "C1")
                ax.plot(xs, ys, style, color=color, marker="o", markersize=3, label=label)
        xs = [_x(r) for r in rs]
        if numeric and max(xs) >= 8 * max(min(xs), 1):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(plain)
            ax.xaxis.set_minor_formatter(NullFormatter())
        ys = [r["us"] for r in rs if r["us"]]
        if ys and max(ys) >= 8 * min(ys):
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain if max(ys) < 80 * min(ys) else NullFormatter())
        if not numeric:
            ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.tick_params(labelsize=7, which="both")
        ax.set_title(op, fontsize=10)
        ax.set_xlabel(_x_label(rs[0]), fontsize=8)
        ax.set_ylabel("µs", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(ops) :]:
        ax.axis("off")
    fig.suptitle(title + " (CUDA-graph replay medians)")
    fig.tight_layout()
    return _save(plt, fig, path)


def _plot_verify(plt, records: list[dict], path: Path, device: str) -> Path:
    ops = [(op, rs) for (op,), rs in _by(records, "op").items() if op != WHOLE_CYCLE]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(ops) + 1.6))
    for i, arm in enumerate((SGLANG, OURS)):
        ys = [next((r["us"] for r in rs if r["arm"] == arm), None) or 0 for _, rs in ops]
        pos = [k + (0.2 if i == 0 else -0.2) for k in range(len(ops))]
        ax.barh(pos, ys, height=0.4, label="SGLang 0.5.23" if arm == SGLANG else "ours")
    labels = [f"{next(r.get('call_site') for r in rs)} ×{rs[0].get('per_cycle')}" for _, rs in ops]
    ax.set_yticks(range(len(ops)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("µs per verify cycle (0: not run)")
    whole = {r["arm"]: r["us"] for r in records if r["op"] == WHOLE_CYCLE}
    names = {SGLANG: "SGLang 0.5.23", OURS: "ours"}
    total = ", ".join(f"{names[a]} {_us(whole.get(a))} µs" for a in (SGLANG, OURS) if a in whole)
    ax.set_title(f"{device}: the verify cycle at BS 1 per call site\nwhole cycle {total}")
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=results.RESULTS, help="the .jsonl files' folder")
    p.add_argument("--doc", type=Path, default=DOC, help="the document with the report blocks")
    p.add_argument("--check", action="store_true", help="exit 1 if --doc is not up to date")
    p.add_argument("--no-plots", action="store_true", help="the tables only")
    args = p.parse_args(argv)
    raw = results.read(sorted(args.results.glob("*.jsonl")))
    records = latest_verify_groups(raw, current(raw))
    old = args.doc.read_text()
    new = render(old, records)
    if args.check:
        if new == old:
            return 0
        diff = difflib.unified_diff(
            old.splitlines(), new.splitlines(), "now", "generated", lineterm=""
        )
        print("\n".join(list(diff)[:60]))
        print(f"{args.doc} is stale: run python -m benchmark.report", file=sys.stderr)
        return 1
    if new != old:
        args.doc.write_text(new)
        print(f"wrote {args.doc}")
    if not args.no_plots:
        for path in plot(records, args.results):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
