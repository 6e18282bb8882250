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

from dsv41_kernels.interpreter import kernels_interpreted

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
