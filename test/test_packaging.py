"""What a newcomer meets first: the package metadata and the README's first commands."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_string():
    """The TOML-table form is deprecated; setuptools stops building it after 2027-02-18."""
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in pyproject["build-system"]["requires"]  # the string form's floor


def test_readme_installs_the_cpu_torch_before_the_package():
    """Installing the package first pulls a CUDA torch onto a CPU-only machine."""
    commands = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    lines = commands.splitlines()
    cpu_torch = next(i for i, line in enumerate(lines) if "download.pytorch.org/whl/cpu" in line)
    package = next(i for i, line in enumerate(lines) if 'pip install -e ".[test]"' in line)
    assert cpu_torch < package


def test_license_file_ships_in_the_sdist_and_wheel_metadata():
    """Apache-2.0 asks that the license text travel with the code: ``License-File`` names it."""
    tomllib = pytest.importorskip("tomllib")
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license-files"] == ["LICENSE"]


def test_the_sdist_ships_no_partial_test_tree(tmp_path):
    """setuptools puts ``test/test*.py`` into an sdist by default, without the conftest and
    helpers they import: MANIFEST.in prunes the tree instead."""
    pytest.importorskip("build")
    env = {**os.environ, "DSV41_KERNELS_PREBUILD": "0"}
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        env=env,
    )
    (sdist,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = names[0].split("/")[0]
    assert f"{top}/LICENSE" in names
    assert not [n for n in names if n.startswith(f"{top}/test/")]
    assert [n for n in names if n.startswith(f"{top}/sgl-kernel/csrc/")]
    policies = f"{top}/python/dsv41_kernels/sglang_plugin/policies/"
    assert [n for n in names if n.startswith(policies) and n.endswith(".json")]


def test_python_dash_m_runs_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "dsv41_kernels", "--version"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("dsv41-kernels ")
