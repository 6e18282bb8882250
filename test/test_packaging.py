"""What a newcomer meets first: the package metadata and the README's first commands."""

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
