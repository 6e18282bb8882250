"""The ``no-history`` pre-commit hook, run by CI over the whole tree.

The hook (``.pre-commit-config.yaml``) rejects session and call narration and paths of run logs
in the code folders; pre-commit only sees the files of a commit, so this test runs the hook's
own regex and file filter over every file git knows of (tracked, or new and not ignored) and
lists the offending lines. Its regex is read from the config, never restated here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".pre-commit-config.yaml"
HOOK_ID = "no-history"


def _value(line: str) -> str:
    """A YAML scalar as the config writes it: plain or single-quoted (no escapes inside)."""
    value = line.split(":", 1)[1].strip()
    if value.startswith("'") and value.endswith("'"):
        value = value[1:-1].replace("''", "'")
    return value


def hook_settings() -> dict[str, str]:
    """The hook's ``entry`` and ``files``, and the config's top-level ``exclude``, read
    line by line (the test environment need not have a YAML parser)."""
    settings, in_hook = {}, False
    for line in CONFIG.read_text().splitlines():
        stripped = line.strip()
        if line.startswith("exclude:"):
            settings["exclude"] = _value(line)
        elif stripped.startswith("- id:"):
            in_hook = _value(stripped[2:]) == HOOK_ID
        elif in_hook and stripped.startswith(("entry:", "files:", "language:")):
            settings[stripped.split(":", 1)[0]] = _value(stripped)
    return settings


def known_files() -> list[str]:
    """Every file git tracks or would add (untracked, not ignored); skips outside a checkout."""
    try:
        done = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"git does not run here: {e}")
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    return done.stdout.splitlines()


def test_hook_is_configured():
    settings = hook_settings()
    assert settings.get("language") == "pygrep", settings
    assert {"entry", "files"} <= settings.keys(), settings


# The rejected examples are split in two, so that this file passes the hook itself.
@pytest.mark.parametrize(
    "line, rejected",
    [
        ("# measured in session" + " 13", True),
        ("# Session" + "7 probes", True),
        ("# see call" + " 5 of that run", True),
        ("# (call" + "5/logs/probe.log)", True),
        ("# docs/" + "results/h200/x.log", True),
        ("# default docs/results/<device>.jsonl, docs/results/*.png", False),
        ("result = call1(x)", False),
        ("call2 = make()", False),
        ("mock.call(5)", False),
        ("recall 5 items; the call site; call_sites", False),
        ('@pytest.fixture(scope="session")', False),
    ],
)
def test_regex_rejects_narration_not_code(line, rejected):
    assert bool(re.search(hook_settings()["entry"], line)) == rejected


def test_no_history_in_the_code_folders():
    settings = hook_settings()
    entry, files = re.compile(settings["entry"]), re.compile(settings["files"])
    exclude = re.compile(settings["exclude"]) if "exclude" in settings else None
    offending = []
    for name in known_files():
        if not files.search(name) or (exclude is not None and exclude.search(name)):
            continue
        path = ROOT / name
        if not path.is_file():  # deleted in the working tree, not yet staged
            continue
        text = path.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if entry.search(line):
                offending.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not offending, f"{len(offending)} lines the {HOOK_ID} hook rejects:\n" + "\n".join(
        offending
    )
