"""The shared server (`--http HOST:PORT`) as tests drive it: started on a port the OS picks
(read back from the log line that says where it serves), with the echo backend; the SDK's
own client in either protocol generation; raw 2025-11-25 sessions and 2026-07-28 calls."""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
import tempfile
from contextlib import asynccontextmanager

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from harness import REPO, errlog_text, ok, shim_command, shim_env

MODES = ("legacy", "2026-07-28")  # 2025-11-25 with a session; 2026-07-28 without
ACCEPT = "application/json, text/event-stream"


class HttpWisp:
    def __init__(self, proc: subprocess.Popen, errlog, url: str, token: str) -> None:
        self.proc, self.errlog, self.url, self.token = proc, errlog, url, token
        self.port = int(re.search(r":(\d+)/mcp", url).group(1))

    def log(self) -> str:
        return errlog_text(self.errlog)

    def core_pids(self) -> list[int]:
        return [int(m) for m in re.findall(r"wisp-core ready: pid (\d+)", self.log())]

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Accept": ACCEPT, **extra}


def start_http(*args: str, env: dict[str, str] | None = None, token: str | None = None, errlog=None,
               backend: str | None = "echo") -> subprocess.Popen:
    token_env = {"WISP_HTTP_TOKEN": token} if token else {}
    backend_args = ("--backend", backend) if backend else ()
    return subprocess.Popen(
        shim_command(*backend_args, "--http", "127.0.0.1:0", *args), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=errlog if errlog is not None else subprocess.PIPE,
        env=shim_env(**token_env, **(env or {})), cwd=REPO,
    )


@asynccontextmanager
async def http_wisp(*args: str, env: dict[str, str] | None = None, backend: str | None = "echo"):
    token = secrets.token_urlsafe(32)
    with tempfile.TemporaryFile("w+") as errlog:
        proc = start_http(*args, env=env, token=token, errlog=errlog, backend=backend)
        server = None
        try:
            with anyio.fail_after(20):
                while True:
                    errlog.seek(0)
                    m = re.search(r"serving MCP at (http://\S+/mcp)", errlog.read())
                    if m:
                        break
                    assert proc.poll() is None, f"wisp --http exited with {proc.returncode}"
                    await anyio.sleep(0.02)  # the poll's interval
            server = HttpWisp(proc, errlog, m.group(1), token)
            yield server
        except BaseException:
            sys.stderr.write("---- wisp --http stderr ----\n" + (server.log() if server else "")[-8000:] + "\n")
            raise
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@asynccontextmanager
async def client(server: HttpWisp, mode: str = "legacy", token: str | None = None, **kw):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token or server.token}"}, timeout=60) as hc:
        async with Client(streamable_http_client(server.url, http_client=hc), mode=mode, **kw) as c:
            yield c


def modern_call(name: str, arguments: dict, id: int = 1) -> dict:
    """A 2026-07-28 tools/call, self-contained as that protocol sends one."""
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": name, "arguments": arguments,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}},
    }}


MODERN_HEADERS = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "respond"}


async def threads_of(server: HttpWisp) -> dict[str, int]:
    async with client(server) as c:
        listing = ok(await c.call_tool("list_threads", {}))
    return {t["thread_id"]: t["turns"] for t in listing["threads"]}


async def events(lines) -> dict:
    """The next JSON-RPC message on an SSE stream."""
    async for line in lines:
        if line.startswith("data:"):
            return json.loads(line[5:])
    raise AssertionError("the stream ended")


async def legacy_session(hc: httpx2.AsyncClient, server: HttpWisp, capabilities: dict | None = None) -> dict[str, str]:
    """A raw 2025-11-25 session: initialize, initialized; the headers its requests carry."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": capabilities or {}, "clientInfo": {"name": "raw", "version": "0"}}}
    r = await hc.post(server.url, json=init, headers=server.headers())
    assert r.status_code == 200, r.text
    headers = server.headers(**{"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"})
    r = await hc.post(server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert r.status_code == 202, r.text
    return headers
