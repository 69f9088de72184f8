"""Clients and process helpers for `make bench` (bench/run.py).

- `mcp_client`: the `mcp` SDK's own Client over stdio (what an MCP host runs), optionally
  counting the bytes it writes to the server.
- `RawClient`: newline-delimited JSON-RPC over a child's pipes, with many requests in flight.
  Used where the client library would be the bottleneck (10,000 create/close cycles) or would
  blur the figure (cold start), and where the server's pid is needed (RSS).
- `all_threads`: every thread `list_threads` lists, page after page, through either client.
- `rss_kb`: resident memory of a process and all its descendants, from /proc.
- `interleaved_times`: the round-trip loop every ratio of two servers is measured by.
- `log`, `median`, `pct`: the figures' arithmetic and the bench's stderr lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CORE = Path(os.environ.get("WISP_CORE") or REPO / ".build" / "release" / "wisp-core")
PY = sys.executable
# Large enough that no benchmark thread is ever condensed: every turn stays in memory.
BIG_CONTEXT = "100000000"


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def median(xs: list[float]) -> float | None:
    """None when nothing was measured (a section that skipped a part)."""
    return float(statistics.median(xs)) if xs else None


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]


async def interleaved_times(clients: dict[str, Any], args: dict[str, dict[str, Any]], calls: int) -> dict[str, list[float]]:
    """Each client's `respond` call (with its own `args`) timed `calls` times, the clients taking
    turns and rotating who goes first, so that no one always follows the same neighbour and a
    change in the machine's load falls on all of them alike. Warmed first: imports, caches, allocator."""
    names = list(clients)
    for _ in range(max(20, calls // 10)):
        for name in names:
            res = await clients[name].call_tool("respond", args[name])
            assert not res.is_error, res
    times: dict[str, list[float]] = {k: [] for k in names}
    for i in range(calls):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            t = time.perf_counter()
            res = await clients[name].call_tool("respond", args[name])
            times[name].append(time.perf_counter() - t)
            assert not res.is_error, res
    return times


def wisp_argv(*extra: str, backend: str = "echo") -> list[str]:
    return [PY, "-m", "wisp_shim", "--core", str(CORE), "--backend", backend, "--context-size", BIG_CONTEXT, *extra]


def baseline_argv(*extra: str) -> list[str]:
    return [PY, str(REPO / "bench" / "baseline_server.py"), *extra]


def child_env() -> dict[str, str]:
    # WISP_* from the developer's shell must not change what is measured.
    return {k: v for k, v in os.environ.items() if not k.startswith("WISP_")}


# --- the SDK client ----------------------------------------------------------------


class _CountingWrite:
    """Wraps the stdio transport's write stream and adds up the bytes each message becomes
    on the wire, serialised exactly as the SDK's stdio_client writes it."""

    def __init__(self, inner: Any, counter: dict[str, int]) -> None:
        self._inner = inner
        self._counter = counter

    async def send(self, message: Any) -> None:
        wire = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
        self._counter["bytes"] += len(wire.encode())
        self._counter["messages"] += 1
        await self._inner.send(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aenter__(self) -> "_CountingWrite":
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


@asynccontextmanager
async def mcp_client(argv: list[str], counter: dict[str, int] | None = None, env: dict[str, str] | None = None):
    """The SDK's Client over stdio, with the server's stderr kept in a temp file (shown on failure);
    `env`: WISP_* settings for the measured wisp."""
    from mcp import Client, StdioServerParameters, stdio_client

    params = StdioServerParameters(command=argv[0], args=argv[1:], env={**child_env(), **(env or {})}, cwd=str(REPO))
    with tempfile.TemporaryFile("w+") as errlog:
        transport = stdio_client(params, errlog=errlog)
        if counter is not None:
            transport = _counting(transport, counter)
        try:
            async with Client(transport) as client:
                yield client
        except BaseException:
            errlog.seek(0)
            sys.stderr.write(f"---- stderr of {' '.join(argv[:4])} ----\n" + errlog.read()[-4000:] + "\n")
            raise


@asynccontextmanager
async def _counting(transport: Any, counter: dict[str, int]):
    async with transport as (read, write):
        yield read, _CountingWrite(write, counter)


async def all_threads(call: Any, page: int = 100) -> tuple[list[dict], int]:
    """Every thread `list_threads` lists, following `next_cursor`, and how many pages it took.

    `call(arguments)` returns one listing's structured content: the bench counts threads, and
    a listing gives at most `page` (at most 100) a call."""
    threads: list[dict] = []
    args: dict[str, Any] = {"limit": page}
    pages = 0
    while True:
        out = await call(args)
        pages += 1
        threads += out["threads"]
        if not out.get("next_cursor"):
            return threads, pages
        args = {"limit": page, "cursor": out["next_cursor"]}


# --- a raw JSON-RPC client --------------------------------------------------------------

INITIALIZE_PARAMS = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "wisp-bench", "version": "0"}}


class RawClient:
    """Newline-delimited JSON-RPC to a child process; any number of requests in flight."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._next = 0
        self._pending: dict[int, asyncio.Future[dict]] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def spawn(cls, argv: list[str], env: dict[str, str] | None = None, cwd: Path = REPO) -> "RawClient":
        """`env`: the whole environment (default: this one without WISP_* settings)."""
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=child_env() if env is None else env, cwd=str(cwd), limit=1 << 24,
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            fut = self._pending.pop(msg.get("id"), None) if "id" in msg else None
            if fut is not None and not fut.done():
                fut.set_result(msg)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("server closed its stdout"))

    def send_line(self, msg: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg, separators=(",", ":")) + "\n").encode())

    async def request(self, method: str, params: dict | None = None) -> dict:
        self._next += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next, "method": method}
        if params is not None:
            msg["params"] = params
        fut = asyncio.get_running_loop().create_future()
        self._pending[self._next] = fut
        self.send_line(msg)
        reply = await fut
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    async def initialize(self) -> None:
        await self.request("initialize", INITIALIZE_PARAMS)
        self.send_line({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def call(self, name: str, arguments: dict) -> dict:
        result = await self.request("tools/call", {"name": name, "arguments": arguments})
        if result.get("isError"):
            raise RuntimeError(f"{name} failed: {result['content'][0]['text']}")
        return result.get("structuredContent") or {}

    async def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 5)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()


# --- memory ---------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(x) for x in text.split()]
    except OSError:
        return []


def tree(pid: int) -> list[int]:
    out = [pid]
    for child in _children(pid):
        out += tree(child)
    return out


def rss_kb(pid: int) -> int:
    """VmRSS of pid and every descendant (shim + wisp-core), in KiB."""
    total = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total
