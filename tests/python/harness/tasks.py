"""MCP tasks as tests drive them: a shim over stdio by raw JSON-RPC lines in either
generation that defines tasks (2025-11-25's `tasks` capability, 2026-07-28's extension), and
the task handles its calls answer with."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Any

from harness import REPO, close_shim, held_args, jsonrpc, release_args, released, shim_command, shim_env, wait_until

LEGACY, MODERN = "2025-11-25", "2026-07-28"
GENERATIONS = (LEGACY, MODERN)
EXT = "io.modelcontextprotocol/tasks"
RELATED = "io.modelcontextprotocol/related-task"


def call(tool: str, **arguments: Any) -> dict:
    """tools/call params."""
    return {"name": tool, "arguments": arguments}


def legacy(rid: int, method: str, params: dict) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def envelope(declare: bool = True) -> dict:
    """A 2026-07-28 request's `_meta`, declaring the tasks extension or not."""
    caps = {"extensions": {EXT: {}}} if declare else {}
    return {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": caps}


class Raw:
    """A shim over stdio driven by JSON-RPC lines: requests by id, notifications kept in order."""

    def __init__(self, generation: str, declare: bool = True, *args: str, env: dict[str, str] | None = None) -> None:
        self.generation, self.declare = generation, declare
        self.proc = subprocess.Popen(
            shim_command("--backend", "echo", *args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=shim_env(**(env or {})), cwd=REPO,
        )
        self.replies: dict[Any, dict] = {}
        self.notes: list[dict] = []
        self._arrived = threading.Condition()
        self._next = 100
        threading.Thread(target=self._read, daemon=True).start()
        if generation == LEGACY:
            caps = {"tasks": {}} if declare else {}
            self.initialized = self.request("initialize", {
                "protocolVersion": LEGACY, "capabilities": caps, "clientInfo": {"name": "raw", "version": "0"}})
            self.send(jsonrpc("notifications/initialized"))

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._arrived:
                if "id" in msg and "method" not in msg:
                    self.replies[msg["id"]] = msg
                else:
                    self.notes.append(msg)
                self._arrived.notify_all()

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def start(self, method: str, params: dict | None = None) -> int:
        self._next += 1
        params = dict(params or {})
        if self.generation == MODERN:
            params["_meta"] = {**params.get("_meta", {}), **envelope(self.declare)}
        self.send(jsonrpc(method, params, id=self._next))
        return self._next

    def wait(self, rid: int, timeout: float = 30) -> dict:
        with self._arrived:
            assert self._arrived.wait_for(lambda: rid in self.replies, timeout), f"no reply {rid}"
            return self.replies.pop(rid)

    def request(self, method: str, params: dict | None = None) -> dict:
        return self.wait(self.start(method, params))

    def respond(self, prompt: str, thread_id: str, task: bool = True, progress: str | None = None) -> int:
        params: dict = {"name": "respond", "arguments": {"prompt": prompt, "thread_id": thread_id}}
        if task and self.generation == LEGACY:
            params["task"] = {"ttl": 60000}
        if progress:
            params["_meta"] = {"progressToken": progress}
        return self.start("tools/call", params)

    def pending(self, thread_id: str) -> int:
        listing = self.request("tools/call", {"name": "list_threads", "arguments": {}})["result"]["structuredContent"]
        return next((t["pending"] for t in listing["threads"] if t["thread_id"] == thread_id), 0)

    def until_pending(self, thread_id: str, n: int) -> None:
        deadline = time.monotonic() + 20
        while self.pending(thread_id) != n:
            assert time.monotonic() < deadline, f"thread {thread_id} never had {n} call(s) pending"

    def held(self, key: str, calls: int = 1) -> None:
        """`harness.held`, by raw lines (a plain call: its thread is idle, so never a task)."""
        self._meet(held_args(key, calls))

    def release(self, key: str) -> int:
        """`harness.release`, by raw lines."""
        return released(self._meet(release_args(key)))

    def _meet(self, arguments: dict) -> str:
        msg = self.request("tools/call", {"name": "respond", "arguments": arguments})
        assert not msg["result"].get("isError"), msg
        self.request("tools/call", {"name": "close_thread", "arguments": {"thread_id": arguments["thread_id"]}})
        return msg["result"]["structuredContent"]["text"]

    def outcome(self, task_id: str) -> dict:
        """The task's end as its generation gives it: tasks/result (2025-11-25), or tasks/get
        polled until terminal (2026-07-28): {"status", "result" | "error"}."""
        if self.generation == LEGACY:
            answer = self.request("tasks/result", {"taskId": task_id})
            status = self.request("tasks/get", {"taskId": task_id})["result"]["status"]
            return {"status": status, **{k: answer[k] for k in ("result", "error") if k in answer}}
        got: dict = {}

        def ended() -> bool:
            got.update(self.request("tasks/get", {"taskId": task_id})["result"])
            return got["status"] in ("completed", "failed", "cancelled")

        assert wait_until(ended, 30), "the task never ended"
        return got

    def close(self) -> None:
        close_shim(self.proc, 15)


def handle_of(reply: dict, generation: str) -> str:
    """The task id a tools/call answered with (failing when it answered plainly)."""
    result = reply["result"]
    if generation == LEGACY:
        assert set(result) == {"task", "_meta"} and result["task"]["status"] == "working", result
        return result["task"]["taskId"]
    assert result.get("resultType") == "task" and result["status"] == "working", result
    return result["taskId"]


def make_task(c: Raw, prompt: str, thread_id: str) -> str:
    """A respond call that becomes a task in either generation, as the thread's second turn.
    2026-07-28 (echo): wisp makes a task only of a call that cannot start at once, so a plain
    call is held on the thread first (in both generations, for the same history) and released
    once the task's call is queued behind it."""
    key = f"before-{thread_id}"
    c.respond(f"!hold {key} before {prompt}", thread_id, task=False)
    c.held(key)
    task_id = handle_of(c.wait(c.respond(prompt, thread_id)), c.generation)
    assert c.release(key) == 1
    return task_id
