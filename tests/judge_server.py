"""A local OpenAI-compatible /chat/completions server for the judge tests, with injectable faults.

`JudgeServer(behaviour)` serves on 127.0.0.1 in a thread; `behaviour(n, body)` gets the 0-based request number and
the request JSON and returns a `Reply`: the status, the reply text (or raw bytes), a delay before answering and a
trickle (seconds between the bytes of the body). Every request (body and headers) is recorded.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    text: str = "yes"
    status: int = 200
    delay: float = 0.0
    trickle: float = 0.0
    raw: bytes | None = None
    """Sent instead of a chat completion holding `text` (garbage, a truncated body)."""


def completion_json(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()


def prompt_text(body: dict) -> str:
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else next(p["text"] for p in content if p["type"] == "text")


def grader(n: int, body: dict) -> Reply:
    """A judge that says yes when the model's answer line equals the reference line (the default prompt)."""
    text = prompt_text(body)
    gold = re.search(r"Reference answer: (.*)", text).group(1).strip().lower()
    said = re.search(r"Model's answer: (.*)", text).group(1).strip().lower()
    return Reply("Yes." if said == gold else "No, it differs.")


class JudgeServer:
    def __init__(self, behaviour=grader):
        self.behaviour = behaviour
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    n = len(server.requests)
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                reply = server.behaviour(n, body)
                time.sleep(reply.delay)
                data = reply.raw if reply.raw is not None else completion_json(reply.text)
                if reply.status != 200 and reply.raw is None:
                    data = b'{"error": "injected"}'
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if reply.trickle:
                        for byte in data:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(reply.trickle)
                    else:
                        self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout under test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> JudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
