"""A model server that misbehaves at the HTTP level, byte by byte, as openai_stub.py's
well-formed server cannot: it trickles an answer a byte at a time, cuts a stream or a body
short of its end, or refuses every chat with one status; or streams an answer given to it,
whole and in one write. On 127.0.0.1, in a thread of the test process; every request is
recorded (path, when it came). `Silent`: a server that takes connections and never answers."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field

PROPS = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}
MODELS = {"object": "list", "data": [{"id": "unruly", "object": "model"}]}
PIECES = ["Hello", " there", ",", " friend"]


@dataclass
class Unruly:
    # How the chat answers: whole (a proper SSE stream), no_done (finish_reason but no [DONE]),
    # cut_chunked (`cut_after` deltas, then the chunked body ends properly: no finish_reason, no
    # [DONE]), cut_close (no length: `cut_after` deltas, then the connection closes), short_length (a JSON
    # answer shorter than its Content-Length), or an HTTP status it always answers with.
    chat: str | int = "whole"
    # What a whole answer streams, a delta each, and how it ends: PIECES and "stop" unless given
    # (a large answer written at once, at the wire's speed; "length": stopped at the output cap).
    pieces: list[str] | None = None
    finish: str = "stop"
    cut_after: int = 2  # the deltas a cut stream sends before it ends
    trickle: set[str] = field(default_factory=set)  # paths answered a byte every trickle_s
    trickle_s: float = 0.2
    requests: list[tuple[str, float]] = field(default_factory=list)

    def __enter__(self) -> "Unruly":
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}/v1"
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._sock.close()

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                path = _read_request(conn)
                self.requests.append((path, time.monotonic()))
                answer = self._answer(path)
                if path in self.trickle:
                    for i in range(len(answer)):
                        conn.sendall(answer[i : i + 1])
                        time.sleep(self.trickle_s)  # kept: trickling is this fake's behaviour
                else:
                    conn.sendall(answer)
            except OSError:
                pass  # the client gave up: what the trickling tests want

    def _answer(self, path: str) -> bytes:
        if path == "/props":
            return _response(200, json.dumps(PROPS).encode())
        if path == "/v1/models":
            return _response(200, json.dumps(MODELS).encode())
        if path != "/v1/chat/completions":
            return _response(404, b'{"error": {"code": 404, "message": "File Not Found"}}')
        if isinstance(self.chat, int):
            return _response(self.chat, b'{"error": {"message": "refused on purpose", "type": "server_error"}}')
        pieces = self.pieces if self.pieces is not None else PIECES
        deltas = [_event({"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}) for p in pieces]
        finish = _event({"choices": [{"index": 0, "delta": {}, "finish_reason": self.finish}]})
        usage = _event({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": len(pieces)}})
        if self.chat == "whole":
            return _chunked(deltas + [finish, usage, b"data: [DONE]\n\n"])
        if self.chat == "no_done":
            return _chunked(deltas + [finish, usage])
        if self.chat == "cut_chunked":
            return _chunked(deltas[: self.cut_after])
        if self.chat == "cut_close":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            return head + b"".join(deltas[: self.cut_after])
        assert self.chat == "short_length", self.chat
        body = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "Hello there"}}]}).encode()
        return _response(200, body, length=len(body) + 100)


class Silent:
    """Takes connections (the kernel completes them: it listens) and never answers: it never
    accepts, so every request waits on it for good."""

    def __enter__(self) -> "Silent":
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self._sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


def _read_request(conn: socket.socket) -> str:
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            raise OSError("closed before the request's end")
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next((int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length"), 0)
    while len(body) < length:
        more = conn.recv(65536)
        if not more:
            break
        body += more
    return lines[0].split(" ")[1]


def _response(status: int, body: bytes, length: int | None = None) -> bytes:
    head = (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {length or len(body)}\r\n"
            "Connection: close\r\n\r\n")
    return head.encode() + body


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunked(events: list[bytes]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
