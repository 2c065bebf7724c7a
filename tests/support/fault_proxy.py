"""A small HTTP proxy in front of the real server that injects one fault per request, in order.

Each request to the proxy takes the next fault of its script (then passes through once the script is
used up) and the proxy records what it did, so a test can count exactly what the client saw:

- ``"429"``: 429 Too Many Requests with ``Retry-After: <retry_after>``;
- ``"500"``: 500 Internal Server Error;
- ``"hang"``: forwards nothing and answers nothing for ``hang_s`` seconds (past the client's timeout);
- ``"malformed"``: 200 with a body that is not JSON;
- ``"no_choices"``: 200 with a well-formed completion that has ``"choices": []``;
- ``"400"``: 400 Bad Request (not retryable);
- ``"reply:<text>"``: 200 with a well-formed completion whose answer is ``<text>`` (a judge's answer
  the tiny model could not write, to test how answers are parsed);
- ``"usage:<json>"``: 200 with a completion (answer ``"ok"``) whose ``usage`` is ``<json>`` (``null``,
  ``{"prompt_tokens": null, ...}``, ...), or that has no ``usage`` at all for ``usage:absent``;
- ``"trickle"``: 200 with a well-formed completion sent one byte every ``trickle_s`` seconds (a server
  that holds a request open without ever going quiet for a whole read timeout);
- ``"401:<how>"``: 401 whose message echoes the request's bearer key, as providers do: ``full`` (the
  whole key), ``masked`` (its first 8 and last 4 characters around asterisks), ``dots`` (first 6 and
  last 4 around "..."), ``head`` (its first 10), ``tail`` (its last 8);
- ``"pass"``: forwards the request to the server.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(text: str) -> dict:
    """A well-formed chat completion answering ``text``, with 10 prompt and 5 completion tokens."""
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class FaultProxy:
    def __init__(
        self,
        upstream: str,
        faults: list[str],
        retry_after: float = 1.0,
        hang_s: float = 5.0,
        trickle_s: float = 0.3,
    ):
        self.upstream = upstream.rstrip("/")  # http://127.0.0.1:<port>
        self.faults = list(faults)
        self.retry_after = retry_after
        self.hang_s = hang_s
        self.trickle_s = trickle_s
        self.log: list[tuple[str, float]] = []  # (what was done, when)
        self.bodies: list[dict] = []  # every request body received
        self.headers: list[dict] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with proxy.lock:
                    fault = proxy.faults.pop(0) if proxy.faults else "pass"
                    proxy.log.append((fault, time.monotonic()))
                    proxy.bodies.append(json.loads(body))
                    proxy.headers.append({k.lower(): v for k, v in self.headers.items()})
                if fault == "429":
                    self._answer(429, b'{"error": {"message": "slow down"}}', {"Retry-After": str(proxy.retry_after)})
                elif fault.startswith("reply:"):
                    self._answer(200, json.dumps(completion(fault.removeprefix("reply:"))).encode())
                elif fault.startswith("usage:"):
                    payload = completion("ok")
                    if fault == "usage:absent":
                        del payload["usage"]
                    else:
                        payload["usage"] = json.loads(fault.removeprefix("usage:"))
                    self._answer(200, json.dumps(payload).encode())
                elif fault == "trickle":
                    self._trickle(json.dumps(completion("slow")).encode())
                elif fault.startswith("401:"):
                    key = self.headers.get("authorization", "").removeprefix("Bearer ")
                    echo = {
                        "full": key,
                        "masked": key[:8] + "*" * 20 + key[-4:],
                        "dots": key[:6] + "..." + key[-4:],
                        "head": key[:10],
                        "tail": key[-8:],
                    }[fault.removeprefix("401:")]
                    said = f"Incorrect API key provided: {echo}. You can find your API key in your account."
                    self._answer(401, json.dumps({"error": {"message": said, "code": "invalid_api_key"}}).encode())
                elif fault == "400":
                    self._answer(400, b'{"error": {"message": "unknown model"}}')
                elif fault == "500":
                    self._answer(500, b'{"error": {"message": "internal error"}}')
                elif fault == "hang":
                    time.sleep(proxy.hang_s)
                    self.close_connection = True
                elif fault == "malformed":
                    self._answer(200, b'{"id": "x", "choices": [{"message": ')
                elif fault == "no_choices":
                    payload = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}
                    self._answer(200, json.dumps(payload).encode())
                else:
                    request = urllib.request.Request(
                        proxy.upstream + self.path, data=body, headers={"content-type": "application/json"}
                    )
                    try:
                        with urllib.request.urlopen(request, timeout=120) as response:
                            self._answer(response.status, response.read())
                    except urllib.error.HTTPError as error:
                        self._answer(error.code, error.read())

            def _trickle(self, body: bytes):
                try:
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.flush()
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(proxy.trickle_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what a deadline is for

            def _answer(self, status: int, body: bytes, headers: dict | None = None):
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def done(self) -> list[str]:
        with self.lock:
            return [what for what, _ in self.log]
