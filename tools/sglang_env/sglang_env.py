"""The Python half of build.sh (pack) and activate.sh (install). Standard library only.

    sglang_env.py pack-sglang WHEEL OUT.tar.xz      SGLang's files, minus the Rust extensions
    sglang_env.py pack-tree WHEEL OUT.tar.xz DROP.. a wheel's files, minus the paths DROP
    sglang_env.py extract WHEEL DIR MEMBER..        single files of a wheel, byte for byte
    sglang_env.py manifest DIR                      DIR/MANIFEST.txt (sizes, sha256)
    sglang_env.py activate ...                      see activate.sh
    sglang_env.py stage-tl TL_DIR SITE              see stage_tl.sh

Every tarball holds a wheel's files unchanged: each one is checked against the wheel's own
RECORD (sha256) when packed and again when unpacked. Only whole files are left out, and
MANIFEST.txt names them.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import importlib.machinery
import importlib.metadata
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import time
import zipfile

with contextlib.suppress(ImportError):  # a Python without _lzma: _unpack runs xz instead
    import lzma

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# Left out of SGLang's source: the Rust extensions (46 MB). No module on the paths this
# environment serves imports them (tools/sglang_env/README.md, "What is carried").
SGLANG_DROP = (
    "sglang/srt/rust_extensions/_bench.",
    "sglang/srt/rust_extensions/_grpc.",
    "sglang/srt/rust_extensions/_multimodal.",
    "sglang/srt/rust_extensions/_server.",
    "sglang/srt/mem_cache/rust_tree_core/mem_cache.",
)


def die(msg: str):
    print(f"sglang_env: ERROR: {msg}", file=sys.stderr)
    sys.exit(1)


def _record(zf: zipfile.ZipFile) -> dict[str, str]:
    name = next(n for n in zf.namelist() if re.match(r"[^/]+\.dist-info/RECORD$", n))
    rows = csv.reader(io.StringIO(zf.read(name).decode()))
    return {r[0]: r[1] for r in rows if r and r[1]}


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def pack(wheel: str, out: str, drop: list[str]) -> None:
    """Write the wheel's files (minus those starting with a prefix in drop) as a tar.xz."""
    with zipfile.ZipFile(wheel) as zf:
        record = _record(zf)
        kept, left_out, size = 0, [], 0
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info in sorted(zf.infolist(), key=lambda i: i.filename):
                if info.is_dir():
                    continue
                name = info.filename
                if any(name.startswith(p) for p in drop):
                    left_out.append(f"{name} ({info.file_size} B)")
                    continue
                data = zf.read(info)
                if name in record and _digest(data) != record[name]:
                    die(f"{wheel}: {name} does not match the wheel's RECORD")
                ti = tarfile.TarInfo(name)
                ti.size, ti.mtime = len(data), 0
                ti.mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
                tar.addfile(ti, io.BytesIO(data))
                kept += 1
                size += len(data)
    raw = buf.getvalue()
    # xz -9e with two threads; identical files (z3's two copies of libz3) cost nothing twice.
    xz = subprocess.run(["xz", "-9e", "-T2", "-c"], input=raw, capture_output=True, check=True)
    if lzma.decompress(xz.stdout) != raw:
        die(f"{out}: xz round trip failed")
    pathlib.Path(out).write_bytes(xz.stdout)
    meta = pathlib.Path(out + ".left_out")
    meta.write_text("".join(f"{line}\n" for line in left_out))
    print(
        f"{pathlib.Path(out).name}: {kept} files, {size / 2**20:.1f} MiB -> "
        f"{len(xz.stdout) / 2**20:.1f} MiB xz; left out {len(left_out)} file(s)"
    )


def extract(wheel: str, out: str, members: list[str]) -> None:
    """Copy single files out of a wheel, byte for byte, checked against its RECORD."""
    with zipfile.ZipFile(wheel) as zf:
        record = _record(zf)
        for name in members:
            data = zf.read(name)
            if _digest(data) != record[name]:
                die(f"{wheel}: {name} does not match the wheel's RECORD")
            target = pathlib.Path(out) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            print(f"verbatim {name} from {pathlib.Path(wheel).name} ({len(data)} B)")


def manifest(folder: str) -> None:
    d = pathlib.Path(folder)
    lines, total = [], 0
    for f in sorted(p for p in d.rglob("*") if p.is_file() and p.name != "MANIFEST.txt"):
        size = f.stat().st_size
        total += size
        lines.append(
            f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {size:>10}  {f.relative_to(d)}"
        )
    lines.append(f"total {total} bytes ({total / 2**20:.2f} MiB)")
    (d / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    print(f"{d.name}: {len(lines) - 1} files, {total / 2**20:.2f} MiB")


# --------------------------------------------------------------------------------------------
# activate


def _verify_manifest(d: pathlib.Path) -> str:
    text = (d / "MANIFEST.txt").read_text()
    for line in text.splitlines()[:-1]:
        digest, _size, rel = line.split(None, 2)
        f = d / rel
        if not f.is_file() or hashlib.sha256(f.read_bytes()).hexdigest() != digest:
            die(f"{f} is missing or differs from {d / 'MANIFEST.txt'}: rebuild and carry it again")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _unpack(tarball: pathlib.Path, site: pathlib.Path) -> int:
    """Unpack a tarball from pack() into site, checking every file against the RECORD in it."""
    try:
        data = lzma.decompress(tarball.read_bytes())
    except NameError:  # a Python built without _lzma: the xz program instead
        data = subprocess.run(["xz", "-dc", str(tarball)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        rec_name = next(m.name for m in members if re.match(r"[^/]+\.dist-info/RECORD$", m.name))
        rows = csv.reader(io.StringIO(tar.extractfile(rec_name).read().decode()))
        record = {r[0]: r[1] for r in rows if r and r[1]}
        for m in members:
            blob = tar.extractfile(m).read()
            if m.name in record and _digest(blob) != record[m.name]:
                die(f"{tarball}: {m.name} differs from its wheel's RECORD")
            out = site / m.name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(blob)
            out.chmod(m.mode)
    return len(members)


def _standins_dir(site, standin_src, verbatim, wanted, path):
    """A folder holding the stand-ins whose real package is not importable on `path`.

    A stand-in is linked from standins/; one with real files carried in .sglang_env/verbatim/
    is copied, and those files (byte for byte from the real wheel) laid beside its modules.
    """
    import shutil

    out = site.parent / (site.name + "_standins")
    sys_path = [p for p in path if p] + [
        p for p in sys.path if p and not (pathlib.Path(p) / "_sglang_env_standin.py").exists()
    ]
    used = [n for n in wanted if importlib.machinery.PathFinder.find_spec(n, sys_path) is None]
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "_sglang_env_standin.py").symlink_to(standin_src / "_sglang_env_standin.py")
    for name in used:
        if (verbatim / name).is_dir():
            shutil.copytree(standin_src / name, out / name)
            shutil.copytree(verbatim / name, out / name, dirs_exist_ok=True)
        else:
            (out / name).symlink_to(standin_src / name)
    return out, used


def _plugin_dist_info(site: pathlib.Path, path: list[str]) -> str:
    """Make dsv41_kernels's entry point visible to importlib.metadata, unless it already is."""
    import shutil

    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = site / f"dsv41_kernels-{project['version']}.dist-info"
    elsewhere = [
        d
        for d in importlib.metadata.distributions(path=[p for p in path if p] + sys.path)
        if (d.metadata["Name"] or "").replace("_", "-").lower() == "dsv41-kernels"
        and pathlib.Path(str(getattr(d, "_path", ""))).parent != site
    ]
    if elsewhere:  # installed (pip install -e .): one entry point, not two
        shutil.rmtree(ours, ignore_errors=True)
        return "entry point installed"
    ours.mkdir(parents=True, exist_ok=True)
    (ours / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project.get("entry-points", {})
    (ours / "entry_points.txt").write_text(
        "".join(
            f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
            for g, eps in groups.items()
        )
    )
    return "entry point written to " + ours.name


def _unmet(site: pathlib.Path, path: list[str]) -> list[str]:
    """Requirements of the carried distributions that this environment does not meet."""
    try:
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name
    except ImportError:
        return ["(packaging missing: requirements not checked)"]
    have = {}
    for d in importlib.metadata.distributions(path=[p for p in path if p] + sys.path):
        have.setdefault(canonicalize_name(d.metadata["Name"] or ""), d.version)
    out = []
    for dist_dir in sorted(site.glob("*.dist-info")):
        dist = importlib.metadata.PathDistribution(dist_dir)
        name = dist.metadata["Name"]
        if canonicalize_name(name) in ("sglang", "dsv41-kernels"):  # SGLang pins CUDA builds
            continue
        for req in dist.requires or ():
            r = Requirement(req)
            if r.marker is not None and not r.marker.evaluate({"extra": ""}):
                continue
            version = have.get(canonicalize_name(r.name))
            if version is None:
                out.append(f"{name}: {r} (absent)")
            elif r.specifier and not r.specifier.contains(version, prereleases=True):
                out.append(f"{name}: {r} (have {version})")
    return out


def stage_tl(args: list[str]) -> None:
    """Unpack .sglang_env_tl into SITE ahead of the run that activates (a staging run)."""
    tl_dir, site = map(pathlib.Path, args[:2])
    if not (tl_dir / "MANIFEST.txt").is_file():
        die(f"{tl_dir} is not here: carry it in this run (README.md, staging)")
    t0 = time.time()
    tl_key = _verify_manifest(tl_dir)
    stamp = site / ".sglang_env.stamp"
    site.mkdir(parents=True, exist_ok=True)
    state = json.loads(stamp.read_text()) if stamp.is_file() else {}
    n = 0
    if state.get("tl") != tl_key:
        n = sum(_unpack(t, site) for t in sorted(tl_dir.glob("*.tar.xz")))
        state["tl"] = tl_key
        stamp.write_text(json.dumps(state))
    print(
        f"sglang_env: tilelang 0.1.12 + z3 staged in {site} ({n} files unpacked) and kept in "
        f"{tl_dir} for the next run; {time.time() - t0:.1f} s",
        file=sys.stderr,
    )


def activate(args: list[str]) -> None:
    env_dir, tl_dir, site, standin_src = map(pathlib.Path, args[:4])
    t0 = time.time()
    if not (env_dir / "MANIFEST.txt").is_file():
        die(f"{env_dir} is not here: run tools/sglang_env/build.sh, and carry it")
    key = _verify_manifest(env_dir)
    stamp = site / ".sglang_env.stamp"
    state = json.loads(stamp.read_text()) if stamp.is_file() else {}
    parts = []
    if state.get("main") != key:
        site.mkdir(parents=True, exist_ok=True)
        wheels = sorted(str(p) for p in (env_dir / "wheels").glob("*.whl"))
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
             "--no-compile", "--no-cache-dir", "--upgrade", "--disable-pip-version-check",
             "--target", str(site), *wheels],
            check=True,
        )  # fmt: skip
        for tarball in sorted(env_dir.glob("*.tar.xz")):
            _unpack(tarball, site)
        state["main"] = key
        stamp.write_text(json.dumps(state))
        parts.append(f"installed {len(wheels)} wheels + SGLang source")
    else:
        parts.append("already installed")
    tl = "absent"
    if (tl_dir / "MANIFEST.txt").is_file():
        tl_key = _verify_manifest(tl_dir)
        if state.get("tl") != tl_key:
            for tarball in sorted(tl_dir.glob("*.tar.xz")):
                _unpack(tarball, site)
            state["tl"] = tl_key
            stamp.write_text(json.dumps(state))
        tl = "staged"
    elif (site / "tilelang").is_dir() and state.get("tl"):
        tl = f"staged in {site} by an earlier run"
    python_dir = str(ROOT / "python")
    path = [str(site), python_dir]
    standins = [
        line.split()[0]
        for line in (standin_src / "standins.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sdir, used = _standins_dir(site, standin_src, env_dir / "verbatim", standins, path)
    plugin = _plugin_dist_info(site, path)
    unmet = _unmet(site, path)
    sglang_version = importlib.metadata.PathDistribution(
        next(site.glob("sglang-*.dist-info"))
    ).version
    tl_line = (
        f"tilelang 0.1.12 + z3 {tl}"
        if tl != "absent"
        else "tilelang ABSENT (stage .sglang_env_tl first: tools/sglang_env/README.md; "
        "SGLang's tilelang kernels, hc_split_sinkhorn among them, raise ImportError)"
    )
    print(
        f"sglang_env: sglang {sglang_version} from {env_dir.name} -> {site} ({', '.join(parts)}); "
        f"{tl_line}; stand-ins: {' '.join(used) or 'none'}; dsv41_kernels {plugin}; "
        f"unmet requirements: {'; '.join(unmet) or 'none'}; {time.time() - t0:.1f} s",
        file=sys.stderr,
    )
    print(os.pathsep.join([str(site), python_dir, str(sdir)]))


def main():
    cmd, *args = sys.argv[1:] or ["help"]
    if cmd == "pack-sglang":
        pack(args[0], args[1], list(SGLANG_DROP))
    elif cmd == "pack-tree":
        pack(args[0], args[1], args[2:])
    elif cmd == "extract":
        extract(args[0], args[1], args[2:])
    elif cmd == "manifest":
        manifest(args[0])
    elif cmd == "activate":
        activate(args)
    elif cmd == "stage-tl":
        stage_tl(args)
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
