"""The shim over stdio by raw JSON-RPC lines from a thread of its own: responses collected by id,
and a client whose roots are what a test says."""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from typing import Any

from harness import (INITIALIZE, INITIALIZED, REPO, call, close_shim, held_args, jsonrpc, release_args, released, shim_command,
                     shim_env)


class RawChannel:
    """JSON-RPC lines on the shim's stdin; responses collected by id from its stdout."""

    def __init__(self, *args: str) -> None:
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            shim_command("--backend", "echo", *args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.err, env=shim_env(), cwd=REPO,
        )
        self.lines: list[bytes] = []
        self.by_id: dict[Any, list[dict]] = {}
        self.cond = threading.Condition()
        self.eof = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.send(INITIALIZE)
        assert "result" in self.wait(1)
        self.send(INITIALIZED)
        self.next_id = 100

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)  # every line on stdout must be JSON: a failure here fails the test
            with self.cond:
                self.lines.append(line)
                self.by_id.setdefault(msg.get("id", "notification"), []).append(msg)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def wait(self, rid: Any, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not self.by_id.get(rid):
                left = deadline - time.monotonic()
                if self.eof or left <= 0:
                    raise AssertionError(f"no response with id {rid!r} ({'stdout closed' if self.eof else 'timed out'}); stderr:\n{self.stderr()}")
                self.cond.wait(left)
            return self.by_id[rid].pop(0)

    def quiet(self) -> list[bytes]:
        """The lines that arrive before the answer to a ping sent now, that answer aside (for
        inputs that must get no answer): the shim reads its input in order and answers what it
        refuses as it reads it, so whatever it had to say to the lines before has been said."""
        with self.cond:
            n = len(self.lines)
        self.next_id += 1
        rid = f"barrier-{self.next_id}"
        self.send(jsonrpc("ping", id=rid))
        assert self.wait(rid).get("result") == {}
        with self.cond:
            return [line for line in self.lines[n:] if json.loads(line).get("id") != rid]

    def held(self, key: str, calls: int = 1) -> None:
        """`harness.held`, by raw lines."""
        self._meet(held_args(key, calls))

    def release(self, key: str) -> int:
        """`harness.release`, by raw lines."""
        return released(self._meet(release_args(key)))

    def _meet(self, arguments: dict) -> str:
        msg = self.call("respond", arguments)
        assert not msg["result"].get("isError"), msg
        assert self.call("close_thread", {"thread_id": arguments["thread_id"]})["result"]["structuredContent"]["closed"]
        return msg["result"]["structuredContent"]["text"]

    def call(self, name: str, arguments: Any, rid: Any = None) -> dict:
        if rid is None:
            self.next_id += 1
            rid = self.next_id
        self.send(jsonrpc("tools/call", {"name": name, "arguments": arguments}, id=rid))
        return self.wait(rid)

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        close_shim(self.proc, 10)


def raw_roots_session(uris: list[str], then: bytes = b"") -> tuple[dict, float, dict | None]:
    """A call made by a client that offers `uris` as its roots: its reply, how long after the
    client's answer to roots/list it came, and the answer to the request `then` sent after its reply, if any."""
    init = jsonrpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": False}},
                                  "clientInfo": {"name": "wisp-tests", "version": "0"}}, id=1)
    proc = subprocess.Popen(shim_command("--backend", "echo"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=shim_env(), cwd=REPO)
    try:
        proc.stdin.write(init)
        proc.stdin.flush()
        assert "result" in json.loads(proc.stdout.readline())
        proc.stdin.write(INITIALIZED + call("respond", {"prompt": "p", "thread_id": "r", "tools": ["read_file"]}, 2))
        proc.stdin.flush()
        ask = json.loads(proc.stdout.readline())
        assert ask.get("method") == "roots/list", ask
        answer = (json.dumps({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": [{"uri": u} for u in uris]}}) + "\n").encode()
        proc.stdin.write(answer)
        proc.stdin.flush()
        start = time.monotonic()
        reply = json.loads(proc.stdout.readline())
        took = time.monotonic() - start
        if then:
            proc.stdin.write(then)
            proc.stdin.flush()
        return reply, took, json.loads(proc.stdout.readline()) if then else None
    finally:
        proc.stdin.close()
        proc.wait(10)
