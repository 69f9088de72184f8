"""End-to-end harness: the real shim (`python -m wisp_shim`) over stdio, driven by the
`mcp` SDK's own client, in front of the real Swift wisp-core with the echo backend."""

from __future__ import annotations

import json
import os
import sys
import contextlib
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters, stdio_client

REPO = Path(__file__).resolve().parents[2]


def core_path() -> str:
    path = os.environ.get("WISP_CORE") or str(REPO / ".build" / "release" / "wisp-core")
    if not os.access(path, os.X_OK):
        pytest.fail(f"wisp-core not found at {path}: run `make build` first (or set WISP_CORE)", pytrace=False)
    return path


def core_exchange(args: list[str], stdin: bytes, want: tuple[int, ...] = (1,), timeout: float = 60) -> list[dict]:
    """Run wisp-core with `args` and write `stdin` (frames) to it; the frames it wrote back
    until it has answered every id in `want` (or exited). Its stdin stays open till then: at
    EOF a core may exit before it answers what is still running."""
    import struct
    import subprocess
    import threading

    import msgspec

    proc = subprocess.Popen([core_path(), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    frames: list[dict] = []
    try:
        try:
            proc.stdin.write(stdin)
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # it stopped reading (a frame it refused): what it wrote still counts
        waiting = set(want)
        while waiting:
            head = proc.stdout.read(4)
            if len(head) < 4:
                break
            (n,) = struct.unpack(">I", head)
            frames.append(msgspec.json.decode(proc.stdout.read(n)))
            waiting.discard(frames[-1].get("id"))
    finally:
        timer.cancel()
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
        proc.wait(timeout)
        proc.stdout.close()
    return frames


def shim_command(*args: str, core: str | None = None) -> list[str]:
    return [sys.executable, "-m", "wisp_shim", "--core", core or core_path(), *args]


def shim_env(**extra: str) -> dict[str, str]:
    # Only what the test sets: WISP_* from the developer's shell must not leak into a test.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WISP_")}
    env.update(extra)
    return env


@asynccontextmanager
async def wisp(*args: str, core: str | None = None, env: dict[str, str] | None = None, mode: str = "auto", backend: str = "echo"):
    """A connected MCP client; on failure the shim's and core's stderr are shown."""
    argv = shim_command("--backend", backend, *args, core=core) if backend else shim_command(*args, core=core)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env or {}, cwd=str(REPO))
    with tempfile.TemporaryFile("w+") as errlog:
        try:
            async with Client(stdio_client(params, errlog=errlog), mode=mode) as client:
                client.errlog = errlog  # type: ignore[attr-defined]
                yield client
        except BaseException:
            errlog.seek(0)
            sys.stderr.write("---- wisp stderr ----\n" + errlog.read()[-8000:] + "\n")
            raise


def text_of(result) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


def ok(result) -> dict:
    assert not result.is_error, f"unexpected tool error: {text_of(result)}"
    return result.structured_content


def error_text(result) -> str:
    assert result.is_error, f"expected a tool error, got {result.structured_content}"
    return text_of(result)


def jsonrpc(method: str, params: dict | None = None, id: int | None = None) -> bytes:
    msg: dict = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    if id is not None:
        msg["id"] = id
    return (json.dumps(msg) + "\n").encode()


INITIALIZE = jsonrpc(
    "initialize",
    {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "wisp-tests", "version": "0"}},
    id=1,
)
INITIALIZED = jsonrpc("notifications/initialized")
