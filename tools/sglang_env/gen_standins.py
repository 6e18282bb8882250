"""Write the stand-in modules in standins/ from SGLang's source and the real packages' wheels.

For each stood-in package (standins/standins.txt) and each of its modules that SGLang's source
imports, the stand-in exports the names SGLang references (``from pkg.mod import a, b`` and
``pkg.mod.a`` after ``import pkg``), kept only where the real module defines them (read from the
real wheel, statically: nothing of it is imported or run). Modules listed as verbatim are the
real files, copied byte for byte (pure Python that needs only the standard library and torch).

    python3 tools/sglang_env/gen_standins.py --sglang-src DIR \
        --wheel sgl_kernel=sglang_kernel-0.4.10-...whl --wheel deep_gemm=sgl_deep_gemm-...whl

A package given no wheel (IPython) keeps every name SGLang references. Run it again when the
SGLang version changes; the output is tracked.
"""

from __future__ import annotations

import argparse
import ast
import collections
import hashlib
import pathlib
import textwrap
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
STANDINS = HERE / "standins"
# Real, pure-Python modules of a stood-in package, carried as they are (build.sh extracts them
# from the real wheel into .sglang_env/verbatim/; activate.sh puts them beside the stand-in): their
# objects are used at import time (sgl_kernel.scalar_type.scalar_types builds SGLang's
# quantization tables). Not tracked: the repository's formatters would rewrite them.
VERBATIM = {
    "sgl_kernel": ("sgl_kernel/scalar_type.py", "sgl_kernel/utils.py"),
}


def sglang_references(src: pathlib.Path, packages: set[str]):
    """{module: names} SGLang's source (tests left out) references from the given packages."""
    refs: dict[str, set[str]] = collections.defaultdict(set)
    for path in sorted(src.rglob("*.py")):
        if "test" in path.relative_to(src).parts[:2]:
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError:
            continue
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] in packages:
                    refs[node.module].update(a.name for a in node.names)
                    _parents(refs, node.module)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in packages:
                        refs.setdefault(a.name, set())
                        _parents(refs, a.name)
                        aliases[a.asname or a.name.split(".")[0]] = (
                            a.name if a.asname else a.name.split(".")[0]
                        )
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            chain, n = [], node
            while isinstance(n, ast.Attribute):
                chain.append(n.attr)
                n = n.value
            if not (isinstance(n, ast.Name) and n.id in aliases):
                continue
            chain = aliases[n.id].split(".") + chain[::-1]
            for i in range(1, len(chain)):
                if ".".join(chain[:i]) in refs:
                    refs[".".join(chain[:i])].add(chain[i])
    return refs


def _parents(refs, module):
    parts = module.split(".")
    for i in range(1, len(parts)):
        refs[".".join(parts[:i])].add(parts[i])


class RealPackage:
    """Names each module of a wheel binds at top level (if/try bodies included), statically."""

    def __init__(self, wheel: pathlib.Path):
        self.zip = zipfile.ZipFile(wheel)
        self.files = set(self.zip.namelist())
        self.cache: dict[str, set[str] | None] = {}

    def path(self, module):
        base = module.replace(".", "/")
        for cand in (f"{base}/__init__.py", f"{base}.py"):
            if cand in self.files:
                return cand
        return None

    def is_package(self, module):
        return (self.path(module) or "").endswith("__init__.py")

    def names(self, module) -> set[str] | None:
        if module in self.cache:
            return self.cache[module]
        self.cache[module] = set()
        path = self.path(module)
        if path is None:
            self.cache[module] = None
            return None
        out: set[str] = set()
        tree = ast.parse(self.zip.read(path))
        for node in _top_level(tree.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    out.update(_target_names(t))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                out.update(_target_names(node.target))
            elif isinstance(node, ast.Import):
                out.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(module, node, self.is_package(module))
                for a in node.names:
                    if a.name == "*":
                        out.update(n for n in (self.names(src) or ()) if not n.startswith("_"))
                    else:
                        out.add(a.asname or a.name)
        if self.is_package(module):  # submodules are attributes once imported
            prefix = module.replace(".", "/") + "/"
            for f in self.files:
                if f.startswith(prefix) and f.endswith(".py"):
                    out.add(f[len(prefix) :].split("/")[0].removesuffix(".py"))
        out.discard("__init__")
        self.cache[module] = out
        return out


def _top_level(body):
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for h in node.handlers:
                yield from _top_level(h.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _target_names(t):
    if isinstance(t, ast.Name):
        return {t.id}
    if isinstance(t, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(e) for e in t.elts))
    return set()


def _resolve(module, node, is_package):
    if not node.level:
        return node.module
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def read_manifest():
    entries = {}
    for line in (STANDINS / "standins.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, reason = line.split(None, 1)
            entries[name] = reason
    return entries


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-src", required=True, type=pathlib.Path, help="folder holding sglang/")
    ap.add_argument("--wheel", action="append", default=[], help="PKG=PATH of the real wheel")
    args = ap.parse_args()
    wheels = dict(w.split("=", 1) for w in args.wheel)
    manifest = read_manifest()
    refs = sglang_references(args.sglang_src / "sglang", set(manifest))
    for pkg, reason in manifest.items():
        real = RealPackage(pathlib.Path(wheels[pkg])) if pkg in wheels else None
        verbatim = VERBATIM.get(pkg, ())
        modules = sorted(m for m in refs if m.split(".")[0] == pkg)
        for module in modules:
            rel = module.replace(".", "/")
            is_pkg = any(m.startswith(module + ".") for m in modules) or (
                real is not None and real.is_package(module)
            )
            target = STANDINS / (f"{rel}/__init__.py" if is_pkg else f"{rel}.py")
            target.parent.mkdir(parents=True, exist_ok=True)
            if real is not None and real.path(module) in verbatim:
                target.unlink(missing_ok=True)
                continue
            wanted = refs[module]
            have = real.names(module) if real is not None else None
            if real is not None and have is None:
                print(f"{module}: not in the real wheel; SGLang's import of it fails there too")
                continue
            sub = {
                m.rsplit(".", 1)[-1] for m in modules if "." in m and m.rsplit(".", 1)[0] == module
            }
            names = sorted((wanted if have is None else wanted & have) - sub)
            dropped = sorted(wanted - (have or wanted) - sub)
            doc = f"Stand-in for {module}: {reason}"
            doc += (
                " Generated by tools/sglang_env/gen_standins.py: the names SGLang references"
                " that the real module defines."
            )
            if dropped:
                doc += (
                    f" Referenced by SGLang but absent from the real module: {' '.join(dropped)}."
                )
            lines = [
                "# ruff: noqa: E402, F401",
                '"""' + "\n".join(textwrap.wrap(doc, 96)) + '\n"""',
            ]
            body = "\n".join(f"    {n}" for n in names)
            lines += ["", "from _sglang_env_standin import populate", ""]
            lines += [f'populate(\n    globals(),\n    """\n{body}\n""",\n)']
            # Submodules SGLang imports, bound as attributes the way the real package binds them.
            if len(sub) == 1:
                lines += [f"from {module} import {next(iter(sub))}"]
            elif sub:
                lines += [f"from {module} import (", *(f"    {x}," for x in sorted(sub)), ")"]
            lines += [""]
            target.write_text("\n".join(lines))
        for rel in verbatim:
            digest = hashlib.sha256(real.zip.read(rel)).hexdigest() if real else "?"
            print(f"verbatim (carried, not generated) {rel} sha256={digest}")
        print(f"{pkg}: {len(modules)} modules")


if __name__ == "__main__":
    main()
