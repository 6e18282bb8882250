"""BS=1 serving benchmark of an SGLang server: the published protocol (docs/anchors.md).

Protocol, per server start: wait until ``GET /v1/models`` answers 200, ``POST /freeze_gc``
once, then one warm-up and N measured requests, each preceded by ``POST /flush_cache``. A
request is ``POST /generate`` with a fixed 4096-token prompt (``random.Random(42)`` over the
ordinary vocabulary, checked against its published SHA-256), ``sampling_params =
{temperature: 0, max_new_tokens: 1024, ignore_eos: true, stream_interval: 1}`` and
``stream: true``. Recorded per request: output tok/s excluding prefill and the first event,
``(completion tokens - tokens in the first event) / (last event time - first event time)``;
TTFT; accept length (``meta_info.spec_accept_length``); verify steps (``spec_verify_ct``);
finish reason; the largest repeat count of any 16-word n-gram of the output. Checks:
prompt_tokens equals the prompt length, cached_tokens is 0, completion tokens equal the
request. Several starts (``--starts`` with ``--server-cmd``, or ``--pool`` over earlier JSON
files) are pooled: median, minimum and maximum, with every sample kept in the JSON.

    # against a running server (one start)
    python benchmark/serving/bench_bs1.py --url http://127.0.0.1:30021 --json run1.json
    # two starts of a server this script launches and stops
    python benchmark/serving/bench_bs1.py --starts 2 --json bs1.json \\
        --server-cmd "python -m sglang.launch_server ... --port 30021"
    # pool runs measured separately
    python benchmark/serving/bench_bs1.py --pool run1.json run2.json --json pooled.json

Only the Python standard library is used. Exit status 1 if a measured request failed a check.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import http.client
import json
import random
import shlex
import statistics
import subprocess
import sys
import time
import urllib.parse

PROMPT_TOKENS = 4096
PROMPT_SEED = 42
# Token ids 3..127999, 128799..128845, 129264..129270: the ordinary vocabulary (128051 ids).
VOCAB_RANGES = ((3, 128000), (128799, 128846), (129264, 129271))
PROMPT_SHA256 = "c37b49585df8fb22e125ae467003a00fff94a3f010cc7cddc03a3b463d047614"
MAX_NEW_TOKENS = 1024
NGRAM_WORDS = 16
SUMMARY_KEYS = ("output_tok_s", "ttft_s", "spec_accept_length")


def prompt_ids() -> list[int]:
    """The fixed prompt, refusing to run if it is not the published one."""
    vocab = [token for low, high in VOCAB_RANGES for token in range(low, high)]
    rng = random.Random(PROMPT_SEED)
    ids = [vocab[rng.randrange(len(vocab))] for _ in range(PROMPT_TOKENS)]
    digest = hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()
    if digest != PROMPT_SHA256:
        raise SystemExit(f"prompt SHA-256 {digest} != published {PROMPT_SHA256}")
    return ids


def max_ngram_repeat(text: str, n: int = NGRAM_WORDS) -> int:
    """How often the most repeated run of ``n`` words occurs (0 if the text is shorter)."""
    words = text.split()
    grams = collections.Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    return max(grams.values(), default=0)


class Server:
    """HTTP calls to one SGLang server (``http://host:port``)."""

    def __init__(self, url: str, timeout: float):
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.timeout = timeout

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        conn = self._connection()
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def wait_ready(self, deadline_s: float, process: subprocess.Popen | None = None) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if process is not None and process.poll() is not None:
                raise SystemExit(f"server exited with status {process.returncode} before ready")
            try:
                if self.call("GET", "/v1/models")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(1.0)
        raise SystemExit(f"server not ready (GET /v1/models != 200) after {deadline_s:.0f} s")

    def post_ok(self, path: str) -> None:
        status, body = self.call("POST", path, {})
        if status != 200:
            raise SystemExit(f"POST {path} answered {status}: {body[:200]!r}")

    def stream_generate(self, payload: dict) -> tuple[float, list[tuple[float, dict]]]:
        """Send one streamed ``/generate``; returns (send time, [(arrival time, event)])."""
        conn = self._connection()
        try:
            sent = time.perf_counter()
            conn.request(
                "POST", "/generate", body=json.dumps(payload),
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            response = conn.getresponse()
            if response.status != 200:
                raise SystemExit(f"/generate answered {response.status}: {response.read()[:200]!r}")
            events = []
            for raw in response:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[len(b"data:") :].strip()
                if data == b"[DONE]":
                    break
                events.append((time.perf_counter(), json.loads(data)))
            return sent, events
        finally:
            conn.close()


def measure(sent: float, events: list[tuple[float, dict]], max_new_tokens: int) -> dict:
    """One request's sample from its streamed events."""
    if not events:
        raise SystemExit("/generate streamed no events")
    (first_t, first), (last_t, last) = events[0], events[-1]
    meta, first_meta = last.get("meta_info", {}), first.get("meta_info", {})
    completion = meta.get("completion_tokens")
    first_tokens = first_meta.get("completion_tokens")
    decode_s = last_t - first_t
    tok_s = None
    if completion is not None and first_tokens is not None and decode_s > 0:
        tok_s = (completion - first_tokens) / decode_s
    finish = meta.get("finish_reason")
    sample = {
        "ttft_s": first_t - sent,
        "output_tok_s": tok_s,
        "decode_s": decode_s,
        "events": len(events),
        "completion_tokens": completion,
        "first_event_tokens": first_tokens,
        "prompt_tokens": meta.get("prompt_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "spec_accept_length": meta.get("spec_accept_length"),
        "spec_verify_ct": meta.get("spec_verify_ct"),
        "finish_reason": finish.get("type") if isinstance(finish, dict) else finish,
        "max_ngram_repeat": max_ngram_repeat(last.get("text", "")),
    }
    sample["checks"] = {
        "prompt_tokens": sample["prompt_tokens"] == PROMPT_TOKENS,
        "cached_tokens_zero": sample["cached_tokens"] == 0,
        "completion_tokens": completion == max_new_tokens,
        "tok_s_measured": tok_s is not None,
    }
    return sample


def run_start(server: Server, start: int, args) -> list[dict]:
    """One server start: freeze the GC once, then the warm-up and the measured requests."""
    prompt = prompt_ids()
    payload = {
        "input_ids": prompt,
        "sampling_params": {
            "temperature": 0,
            "max_new_tokens": args.max_new_tokens,
            "ignore_eos": True,
            "stream_interval": 1,
        },
        "stream": True,
    }
    server.post_ok("/freeze_gc")
    samples = []
    for index in range(args.warmup + args.requests):
        server.post_ok("/flush_cache")
        sample = measure(*server.stream_generate(payload), args.max_new_tokens)
        sample.update(start=start, index=index, warmup=index < args.warmup)
        samples.append(sample)
        tok_s = sample["output_tok_s"]
        print(
            f"start {start} {'warm-up' if sample['warmup'] else 'request'} {index}: "
            f"{tok_s if tok_s is None else round(tok_s, 2)} tok/s, "
            f"TTFT {sample['ttft_s'] * 1e3:.1f} ms, "
            f"accept {sample['spec_accept_length']}, checks "
            f"{'ok' if all(sample['checks'].values()) else sample['checks']}",
            flush=True,
        )
    return samples


def summarize(samples: list[dict]) -> dict:
    """Pooled median / min / max over the measured (non-warm-up) samples."""
    measured = [s for s in samples if not s["warmup"]]
    summary = {
        "measured": len(measured),
        "starts": len({s["start"] for s in measured}),
        "failed_checks": sum(not all(s["checks"].values()) for s in measured),
    }
    for key in SUMMARY_KEYS:
        values = [s[key] for s in measured if s[key] is not None]
        summary[key] = (
            {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
            if values
            else None
        )
    return summary


def launch(command: str, server: Server, ready_s: float) -> subprocess.Popen:
    process = subprocess.Popen(shlex.split(command))
    server.wait_ready(ready_s, process)
    return process


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:30021")
    parser.add_argument("--requests", type=int, default=6, help="measured requests per start")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up requests per start")
    parser.add_argument("--starts", type=int, default=1, help="server starts (needs --server-cmd)")
    parser.add_argument("--server-cmd", help="command that starts the server (stopped after)")
    parser.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    parser.add_argument("--pool", nargs="+", metavar="JSON", help="pool earlier runs instead")
    parser.add_argument("--json", help="write every sample and the pooled summary here")
    args = parser.parse_args(argv)

    if args.pool:
        samples = []
        for path in args.pool:
            with open(path) as f:
                run = json.load(f)
            offset = len({s["start"] for s in samples})
            samples += [{**s, "start": s["start"] + offset} for s in run["samples"]]
    else:
        if args.starts > 1 and not args.server_cmd:
            parser.error("--starts > 1 needs --server-cmd (or measure starts apart and --pool)")
        server = Server(args.url, args.request_timeout)
        samples = []
        for start in range(args.starts):
            process = (
                launch(args.server_cmd, server, args.ready_timeout) if args.server_cmd else None
            )
            try:
                if process is None:
                    server.wait_ready(args.ready_timeout)
                samples += run_start(server, start, args)
            finally:
                if process is not None:
                    stop(process)
    summary = summarize(samples)
    print(json.dumps(summary, indent=2))
    if args.json:
        protocol = {
            "prompt_tokens": PROMPT_TOKENS,
            "prompt_sha256": PROMPT_SHA256,
            "max_new_tokens": args.max_new_tokens,
            "warmup": args.warmup,
            "requests": args.requests,
        }
        with open(args.json, "w") as f:
            json.dump({"protocol": protocol, "summary": summary, "samples": samples}, f, indent=2)
    return 1 if summary["failed_checks"] else 0


if __name__ == "__main__":
    sys.exit(main())
