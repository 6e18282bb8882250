"""Every dotted ``dsv41_kernels.…`` name in the package's docstrings, comments and messages
resolves: as Python's import does, the longest prefix that is a module, then attributes (so
``dsv41_kernels.reference.inverse_rope_quant_fp8.inverse_rope_quant_fp8`` is that module's
function, ``dsv41_kernels.moe_fused_gate`` the package's lazy export)."""

import importlib
import io
import pathlib
import re
import tokenize

import pytest

import dsv41_kernels

PACKAGE = pathlib.Path(dsv41_kernels.__file__).parent
NAME = re.compile(r"(?<![\w/.])dsv41_kernels(?:\.\w+)+")


def named_in_text(path: pathlib.Path) -> set[str]:
    """Dotted names in the file's strings and comments (import statements are code)."""
    names = set()
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    for token in tokens:
        if token.type in (tokenize.STRING, tokenize.COMMENT):
            names.update(NAME.findall(token.string))
    return names


def resolve(name: str):
    """The object ``name`` denotes; raises ModuleNotFoundError for a third-party module this
    environment lacks (SGLang for the plugin), AttributeError for a name that does not exist."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as e:
            if e.name and not e.name.startswith("dsv41_kernels"):
                raise
            continue
        for attr in parts[end:]:
            obj = getattr(obj, attr)
        return obj
    raise AttributeError(name)


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_dotted_names_resolve(path):
    unresolved = []
    for name in sorted(named_in_text(path)):
        try:
            resolve(name)
        except ModuleNotFoundError as e:
            if e.name and not e.name.startswith("dsv41_kernels"):
                continue  # the plugin's names need SGLang installed
            unresolved.append(f"{name}: {e}")
        except AttributeError as e:
            unresolved.append(f"{name}: {e}")
    assert not unresolved, unresolved
