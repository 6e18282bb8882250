"""The ahead-of-time build says what it is doing while it builds (a wheel build takes minutes)."""

from pathlib import Path

from dsv41_kernels import jit, prebuild


def fake_build(name: str, arch: str, directory: str) -> tuple[str, float]:
    """A module "built" in no time: a file named after it (pickled by reference into the pool)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    library = Path(directory) / f"{name}.so"
    library.write_bytes(name.encode())
    return str(library), 0.0


def test_one_line_when_the_builds_start_and_one_per_module_as_it_ends(monkeypatch, tmp_path):
    monkeypatch.setattr(prebuild, "_build", fake_build)
    monkeypatch.setattr(prebuild, "exported_functions", lambda library: ["run"])
    monkeypatch.setattr(prebuild, "cuda_version", lambda: "13.0")
    monkeypatch.setattr(jit, "toolchain_available", lambda: True)
    lines: list[str] = []
    entries = prebuild.prebuild(tmp_path, ("9.0a",), jobs=2, log=lines.append)
    names = jit.module_names()
    assert len(entries) == len(names)
    assert lines[0] == f"prebuild: building {len(names)} modules with 2 jobs"
    progress = [line for line in lines if line.startswith("prebuild: [")]
    assert len(progress) == len(names)
    assert progress[-1].startswith(f"prebuild: [{len(names)}/{len(names)}]")
    assert {line.split()[2] for line in progress} == set(names)
