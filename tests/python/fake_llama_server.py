"""A stand-in for llama.cpp's `llama-server` (tests copy it into a temp dir, executable, with
this venv's python on the #! line): it answers `--version` and `/health` like the real one,
and what it does when asked to compute is chosen by FAKE_LLAMA_MODE:

- `sigill`: dies by SIGILL on its first /completion or chat request, as a binary built with
  instructions the CPU will not run does (they execute only in the matrix kernels);
- `decode`: answers as a working server does (a few tokens);
- `sigill-at-start`: dies by SIGILL as soon as it is started to serve.

FAKE_LLAMA_RECORD, when set, names a file it appends each POST body to (one JSON line each), and
the argv it was started with (a first line {"argv": [...]}).

Like llama-server, it refuses (401) every request but /health without the key in LLAMA_API_KEY,
when that is set; FAKE_LLAMA_OPEN=1 makes it answer anyone, as a server that ignores its key.
FAKE_LLAMA_CHATTER=N writes N bytes of log to stderr for every request, as a busy server logs.
"""

import json
import os
import resource
import signal
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

MODE = os.environ.get("FAKE_LLAMA_MODE", "sigill")
RECORD = os.environ.get("FAKE_LLAMA_RECORD")
KEY = "" if os.environ.get("FAKE_LLAMA_OPEN") == "1" else os.environ.get("LLAMA_API_KEY", "")
CHATTER = int(os.environ.get("FAKE_LLAMA_CHATTER") or 0)


def record(obj) -> None:
    if RECORD:
        with open(RECORD, "a") as f:
            f.write(json.dumps(obj) + "\n")


def die_like_a_trapped_instruction() -> None:
    # No core file from a test (the default action of SIGILL dumps core).
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGILL, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGILL)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refused(self) -> bool:
        if CHATTER:
            line = b"srv  log_server_r: request: " + self.path.encode() + b" "
            sys.stderr.buffer.write((line + b"." * max(0, CHATTER - len(line) - 1) + b"\n")[:CHATTER])
            sys.stderr.buffer.flush()
        if self.path == "/health" or not KEY or self.headers.get("Authorization") == f"Bearer {KEY}":
            return False
        self._json(401, {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}})
        return True

    def do_GET(self) -> None:
        if self._refused():
            return
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/props":
            self._json(200, {"default_generation_settings": {"n_ctx": 4096}})
        elif self.path.endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": "SmolLM2-135M-Instruct", "object": "model"}]})
        else:
            self._json(404, {"error": {"code": 404, "message": "not found"}})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self._refused():
            return
        record({"path": self.path, "body": json.loads(raw or b"null")})
        if self.path not in ("/completion", "/v1/chat/completions", "/chat/completions"):
            self._json(404, {"error": {"code": 404, "message": "not found"}})
            return
        if MODE == "sigill":
            die_like_a_trapped_instruction()
        if self.path == "/completion":
            self._json(200, {"content": " Paris, the", "tokens_predicted": 4})
        else:
            self._json(200, {"object": "chat.completion", "model": "SmolLM2-135M-Instruct",
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": "Paris."}}]})


def main(argv: list[str]) -> int:
    if "--version" in argv:
        print("version: 0 (fake)\nbuilt with a test", file=sys.stderr)
        return 0
    if MODE == "sigill-at-start":
        die_like_a_trapped_instruction()
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8080
    record({"argv": argv, "key": os.environ.get("LLAMA_API_KEY", "")})
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
