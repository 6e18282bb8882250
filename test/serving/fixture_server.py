"""A small HTTP server speaking the part of SGLang's API the BS=1 benchmark uses, on loopback.

``GET /v1/models``; ``POST /flush_cache``; ``POST /freeze_gc``; ``POST /generate`` with
``stream: true`` answered in SGLang's server-sent-event format (``data: {json}`` lines, then
``data: [DONE]``), each event carrying the cumulative ``text`` and a ``meta_info`` with
``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``spec_verify_ct``,
``spec_accept_length`` and ``finish_reason``. Its pacing is fixed: a prefill delay before the
first event (one token), then verify steps alternating 5 and 6 accepted tokens (accept length
5.5) one ``--step-ms`` apart. A prompt seen since the last ``/flush_cache`` reports it as
cached, so a benchmark that forgets to flush fails its check. ``GET /stats`` returns the
call counts.

Bounded: at most ``--max-requests`` generations (then 503), and the process exits by itself
after ``--idle-s`` without a request or ``--lifetime-s`` in all. Prints its port on start.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFILL_S = 0.02
ACCEPT_PATTERN = (5, 6)


class State:
    def __init__(self, max_requests: int):
        self.lock = threading.Lock()
        self.max_requests = max_requests
        self.counts = {"generate": 0, "flush_cache": 0, "freeze_gc": 0}
        self.cached_prompts: set[tuple[int, ...]] = set()
        self.last_request = time.monotonic()


def handler(state: State, step_s: float):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep the test output quiet
            pass

        def _json(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            state.last_request = time.monotonic()
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": "fixture", "object": "model"}]})
            elif self.path == "/stats":
                with state.lock:
                    self._json(200, dict(state.counts))
            else:
                self._json(404, {"error": self.path})

        def do_POST(self):
            state.last_request = time.monotonic()
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path in ("/flush_cache", "/freeze_gc"):
                with state.lock:
                    state.counts[self.path[1:]] += 1
                    if self.path == "/flush_cache":
                        state.cached_prompts.clear()
                self._json(200, {"success": True})
            elif self.path == "/generate":
                self._generate(body)
            else:
                self._json(404, {"error": self.path})

        def _generate(self, body: dict) -> None:
            prompt = tuple(body["input_ids"])
            params = body.get("sampling_params", {})
            with state.lock:
                if state.counts["generate"] >= state.max_requests:
                    self._json(503, {"error": "request bound reached"})
                    return
                state.counts["generate"] += 1
                cached = len(prompt) if prompt in state.cached_prompts else 0
                state.cached_prompts.add(prompt)
            if not body.get("stream"):
                self._json(400, {"error": "the fixture only streams"})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            total = params["max_new_tokens"]
            time.sleep(PREFILL_S)
            done, steps = 1, 0
            while True:
                finished = done >= total
                meta = {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": done,
                    "cached_tokens": cached,
                    "spec_verify_ct": steps,
                    "spec_accept_length": done / steps if steps else 0.0,
                    "finish_reason": {"type": "length", "length": total} if finished else None,
                }
                text = " ".join(f"w{i % 97}" for i in range(done))
                event = {"text": text, "meta_info": meta}
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()
                if finished:
                    break
                time.sleep(step_s)
                done = min(total, done + ACCEPT_PATTERN[steps % len(ACCEPT_PATTERN)])
                steps += 1
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-requests", type=int, default=16)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--lifetime-s", type=float, default=120.0)
    args = parser.parse_args()
    state = State(args.max_requests)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(state, args.step_ms / 1e3))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    started = time.monotonic()
    while (
        time.monotonic() - state.last_request < args.idle_s
        and time.monotonic() - started < args.lifetime_s
    ):
        time.sleep(0.1)
    server.shutdown()


if __name__ == "__main__":
    main()
