"""The package reads TRITON_INTERPRET as Triton does, once, and admissions agree with the
kernels whatever the spelling, and when the variable changes after import.

Each case is a fresh process (the decision is taken at import), started together."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from dsv41_kernels.interpreter import interpreter_unusable, kernels_interpreted

PROBE = """
import contextlib, io, json, os, sys
import torch
from dsv41_kernels.ops.speculative.row_argmax import row_argmax, row_argmax_admission
from dsv41_kernels import cli
x = torch.randn(6, 8192)
admitted = [bool(row_argmax_admission(x))]
exact = [torch.equal(row_argmax(x), torch.argmax(x, -1))]
os.environ["TRITON_INTERPRET"] = "0" if admitted[0] else "1"  # changed after import
admitted.append(bool(row_argmax_admission(x)))
exact.append(torch.equal(row_argmax(x), torch.argmax(x, -1)))
table = io.StringIO()
with contextlib.redirect_stdout(table):
    status = cli.main(["check", "--ops", "row_argmax"])
print(json.dumps(dict(admitted=admitted, exact=exact, status=status,
                      header=table.getvalue().splitlines()[0])))
"""

SPELLINGS = {"true": True, "On": True, "false": False, "2": False, " ": False}


@pytest.fixture(scope="module")
def probes():
    """Each spelling's probe, run concurrently (a process each)."""
    running = {
        value: subprocess.Popen(
            [sys.executable, "-c", PROBE],
            env={**os.environ, "TRITON_INTERPRET": value},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for value in SPELLINGS
    }
    results = {}
    for value, process in running.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-2000:]
        results[value] = json.loads(out.splitlines()[-1])
    return results


@pytest.mark.parametrize("value", sorted(SPELLINGS))
def test_admission_agrees_with_the_kernels_for_every_spelling(probes, value):
    interpreted = SPELLINGS[value]
    probe = probes[value]
    assert probe["admitted"] == [interpreted, interpreted]  # the same after the change
    assert probe["exact"] == [True, True]  # no "0 active drivers", no garbage
    assert probe["status"] == 0
    compiled = "cuda" if torch.cuda.is_available() else "fallbacks only"
    assert f"({'triton interpreter' if interpreted else compiled})" in probe["header"]


def test_the_answer_is_tritons(monkeypatch):
    for value, interpreted in SPELLINGS.items():
        monkeypatch.setenv("TRITON_INTERPRET", value)
        assert kernels_interpreted() is interpreted


@pytest.mark.parametrize(
    "triton_version, numpy_version, unusable",
    [("3.6.0", "2.4.6", True), ("3.6.0", "2.3.5", False), ("3.7.1", "2.4.6", False)]
    + [("3.9.0", "2.3.5", False), ("3.6.0+git1234", "2.4.0rc1", True)],
)
def test_the_interpreter_known_to_fail_is_named(triton_version, numpy_version, unusable):
    reason = interpreter_unusable(triton_version, numpy_version)
    assert (reason is not None) == unusable
    if unusable:
        assert triton_version in reason and numpy_version in reason


def test_an_unusable_interpreter_sends_the_ops_to_their_fallback(monkeypatch):
    """Triton 3.6 with numpy 2.4 raised TypeError inside a third of the kernels; the ops now
    refuse the interpreter there, saying why, and run their exact torch fallbacks."""
    from dsv41_kernels import admission
    from dsv41_kernels.ops.speculative.row_argmax import row_argmax, row_argmax_admission

    monkeypatch.setattr(admission, "triton_interpreter", lambda: True)
    monkeypatch.setattr(admission, "interpreter_unusable", lambda: "triton 3.6.0 fails")
    logits = torch.randn(3, 5000)
    verdict = row_argmax_admission(logits)
    assert not verdict.ok and "triton 3.6.0 fails" in verdict.reason
    assert torch.equal(row_argmax(logits), torch.argmax(logits, -1))
