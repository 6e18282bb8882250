"""The BS=1 serving benchmark against a real HTTP server process on loopback.

The server (``fixture_server.py``) speaks SGLang's ``/generate`` streaming format with a known
pacing; the real runs are against ``sglang.launch_server`` (docs/sglang.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "bench_bs1", ROOT / "benchmark" / "serving" / "bench_bs1.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.fixture
def server():
    """A fixture server process; yields its URL, stops it (it would also stop by itself)."""
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("fixture_server.py")), "--max-requests", "8"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def stats(url):
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as response:
        return json.load(response)


def test_prompt_is_the_published_one():
    ids = bench.prompt_ids()
    assert len(ids) == 4096
    assert sum(high - low for low, high in bench.VOCAB_RANGES) == 128051
    serialised = json.dumps(ids, separators=(",", ":")).encode()
    assert hashlib.sha256(serialised).hexdigest() == bench.PROMPT_SHA256
    assert bench.prompt_ids() == ids


def test_output_rate_excludes_prefill_and_first_event():
    last = {
        "completion_tokens": 21,
        "prompt_tokens": 4096,
        "cached_tokens": 0,
        "finish_reason": {"type": "length"},
    }
    events = [
        (10.0, {"meta_info": {"completion_tokens": 1}}),
        (10.5, {"meta_info": {"completion_tokens": 6}}),
        (12.0, {"text": "a b", "meta_info": last}),
    ]
    sample = bench.measure(9.0, events, 21)
    assert sample["output_tok_s"] == pytest.approx(20 / 2.0)
    assert sample["ttft_s"] == pytest.approx(1.0)
    assert sample["finish_reason"] == "length"
    assert all(sample["checks"].values())


def test_ngram_repeat():
    assert bench.max_ngram_repeat("a " * 15) == 0
    assert bench.max_ngram_repeat(" ".join(["x"] * 20)) == 5
    assert bench.max_ngram_repeat(" ".join(str(i) for i in range(40))) == 1


def test_protocol_against_server(server, tmp_path):
    out = tmp_path / "bs1.json"
    status = bench.main(
        ["--url", server, "--requests", "3", "--max-new-tokens", "64", "--json", str(out)]
    )
    assert status == 0
    run = json.loads(out.read_text())
    samples = run["samples"]
    assert [s["warmup"] for s in samples] == [True, False, False, False]
    for s in samples:
        assert all(s["checks"].values()), s["checks"]
        assert s["completion_tokens"] == 64 and s["first_event_tokens"] == 1
        assert s["finish_reason"] == "length"
        # 63 tokens after the first event in 12 verify steps of 5 and 6 accepted tokens
        assert s["spec_verify_ct"] == 12 and s["spec_accept_length"] == pytest.approx(64 / 12)
        assert s["output_tok_s"] == pytest.approx(63 / s["decode_s"])
        assert s["ttft_s"] >= 0.02  # the server's prefill delay
    summary = run["summary"]
    assert summary["measured"] == 3 and summary["starts"] == 1 and summary["failed_checks"] == 0
    rates = [s["output_tok_s"] for s in samples[1:]]
    assert summary["output_tok_s"]["min"] == min(rates)
    assert summary["output_tok_s"]["max"] == max(rates)
    assert run["protocol"]["prompt_sha256"] == bench.PROMPT_SHA256
    assert stats(server) == {"generate": 4, "flush_cache": 4, "freeze_gc": 1}

    pooled = tmp_path / "pooled.json"
    assert bench.main(["--pool", str(out), str(out), "--json", str(pooled)]) == 0
    pooled_run = json.loads(pooled.read_text())
    assert pooled_run["summary"]["measured"] == 6 and pooled_run["summary"]["starts"] == 2


def test_unflushed_cache_fails_the_check(server, monkeypatch):
    """Without the flush the server reports the prompt as cached, and the run fails."""
    monkeypatch.setattr(bench.Server, "post_ok", lambda self, path: None)
    assert bench.main(["--url", server, "--requests", "1", "--max-new-tokens", "8"]) == 1
