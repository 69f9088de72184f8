"""The tests' one harness (this package; its modules add the shared server, MCP tasks, raw
JSON-RPC channels and the real local model): the real shim (`python -m wisp_shim`) over stdio, driven by the
`mcp` SDK's own client or by raw JSON-RPC lines, in front of the real Swift wisp-core with
the echo backend (or tests/python/fake_core.py); the core on its own over the pipe; process
inspection; and the model tools' workspace.

Process inspection goes through psutil, so that it means the same on Linux and macOS
(reading /proc would find nothing on a Mac, and an orphan check would then pass without
checking anything). A zombie counts as gone: it has exited, only its parent's bookkeeping is left."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path

import psutil
import pytest
from mcp import Client, StdioServerParameters, stdio_client
from wisp_shim.version import version

REPO = Path(__file__).resolve().parents[3]


def core_path() -> str:
    path = os.environ.get("WISP_CORE") or str(REPO / ".build" / "release" / "wisp-core")
    if not os.access(path, os.X_OK):
        pytest.fail(f"wisp-core not found at {path}: run `make build` first (or set WISP_CORE)", pytrace=False)
    return path


def core_exchange(args: list[str], stdin: bytes, want: tuple[int, ...] = (1,), timeout: float = 60) -> list[dict]:
    """Run wisp-core with `args` and write `stdin` (frames) to it; the frames it wrote back
    until it has replied to every id in `want` (or exited). Its stdin stays open till then: at
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
            if frames[-1].get("event") == "reply":  # a call's events carry its id too
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


def echo_n(r: dict) -> int:
    """The turn number an echo reply starts with ("echo N: ..."; docs/echo.md)."""
    return int(r["text"].split(":", 1)[0].removeprefix("echo "))


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


# --- the shim as a process, by raw JSON-RPC lines ---


def spawn(*args: str, stderr=None) -> subprocess.Popen:
    return subprocess.Popen(
        shim_command("--backend", "echo", *args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=stderr if stderr is not None else subprocess.DEVNULL, env=shim_env(), cwd=REPO,
    )


def close_shim(proc: subprocess.Popen, timeout: float) -> None:
    """Close a shim's stdin (its client leaving) and wait for it to exit; kill it past `timeout`."""
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_until(proc: subprocess.Popen, want_id: int, lines: list[bytes], timeout: float = 15) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"stdout closed before response {want_id}")
        lines.append(line)
        msg = json.loads(line)
        if msg.get("id") == want_id:
            return msg
    raise AssertionError(f"no response {want_id} within {timeout} s")


def call(name: str, arguments: dict, id: int, progress_token: str | None = None) -> bytes:
    params: dict = {"name": name, "arguments": arguments}
    if progress_token:
        params["_meta"] = {"progressToken": progress_token}
    return jsonrpc("tools/call", params, id=id)


def spawn_initialized(*args: str, argv: list[str] | None = None) -> subprocess.Popen:
    """A shim (echo backend, or `argv`) past `initialize`, with one call answered, so its core runs."""
    proc = subprocess.Popen(
        argv or shim_command("--backend", "echo", *args), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=shim_env(), cwd=REPO,
    )
    lines: list[bytes] = []
    proc.stdin.write(INITIALIZE)
    proc.stdin.flush()
    read_until(proc, 1, lines)
    proc.stdin.write(INITIALIZED + call("respond", {"prompt": "hi"}, 2))
    proc.stdin.flush()
    read_until(proc, 2, lines)
    return proc


# --- the core's processes ---


FAKE_CORE = Path(__file__).parents[1] / "fake_core.py"


def errlog_text(errlog) -> str:
    """What a process has written to its stderr file so far; the file is left at its end, for it to go on writing."""
    errlog.flush()
    errlog.seek(0)
    text = errlog.read()
    errlog.seek(0, os.SEEK_END)
    return text


def core_pids(client, wait: float = 5.0) -> list[int]:
    """The pids of the cores the shim has started, from its log. The shim's log is written by a
    thread of its own, so a line can land after the reply that followed it: wait (up to `wait`
    seconds) until at least one is there."""
    pids: list[int] = []

    def logged() -> bool:
        pids[:] = [int(m) for m in re.findall(r"wisp-core ready: pid (\d+)", errlog_text(client.errlog))]
        return bool(pids)

    wait_until(logged, wait)
    return pids


def wait_until(predicate, timeout: float) -> bool:
    """Whether `predicate` came true within `timeout` seconds (a poll of what the test can see,
    for the tests that are not async)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(0.02)  # the poll's interval
    return True


async def wait_for(predicate, timeout: float, what: str = "condition not met in time") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)  # the poll's interval


async def until_pending(client, thread_id: str, calls: int = 1, since_turns: int | None = None,
                        timeout: float = 30) -> None:
    """Wait until the core holds `calls` calls on `thread_id` (running or queued: its `pending` in
    `list_threads`), so that a call sent without awaiting it has reached its thread before the
    test acts on it; a rendezvous on what the core reports, not a guess of how long that takes.
    With `since_turns` (the thread's turns before the calls), calls already answered count too,
    for calls short enough to end before a listing sees them."""
    deadline = time.monotonic() + timeout
    while True:
        listing = ok(await client.call_tool("list_threads", {"limit": 100}))
        found = [t["pending"] + (t["turns"] - since_turns if since_turns is not None else 0)
                 for t in listing["threads"] if t["thread_id"] == thread_id]
        if found and found[0] >= calls:
            return
        assert time.monotonic() < deadline, f"{thread_id} never had {calls} call(s) pending: {found}"
        await asyncio.sleep(0.02)  # the poll's interval


# Echo's meeting points (docs/echo.md): a call sent as `!hold KEY …` is parked until `release`;
# `held` returns once the calls are parked, so a test knows they started. Each goes to a thread
# of its own (a thread answers one call at a time, and these must not wait behind what they
# free), closed once it has answered, so that listings and thread counts show the test's own.


def held_args(key: str, calls: int = 1) -> dict:
    """respond's arguments for a call that answers once `calls` calls are parked at `!hold KEY`."""
    return {"prompt": f"!held {key} {calls}", "thread_id": f"held-{key}"}


def release_args(key: str) -> dict:
    """respond's arguments for a call that frees the calls parked at `!hold KEY`."""
    return {"prompt": f"!release {key}", "thread_id": f"release-{key}"}


def released(text: str) -> int:
    """How many calls a release freed, from its reply (`echo N: released C`)."""
    return int(text.rsplit(" ", 1)[1])


async def held(client, key: str, calls: int = 1) -> None:
    """Return once `calls` calls are parked at echo's `!hold KEY` at the same time."""
    await _meet(client, held_args(key, calls))


async def release(client, key: str) -> int:
    """Free the calls parked at `!hold KEY`; how many there were."""
    return released(await _meet(client, release_args(key)))


async def _meet(client, arguments: dict) -> str:
    text = ok(await client.call_tool("respond", arguments))["text"]
    ok(await client.call_tool("close_thread", {"thread_id": arguments["thread_id"]}))
    return text


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def running(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return _alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def children(pid: int) -> list[int]:
    """The running direct children of `pid`, oldest first."""
    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    alive = [k for k in kids if _alive(k)]
    return [k.pid for k in sorted(alive, key=lambda k: (k.create_time(), k.pid))]


def ppid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return None


def grandchildren_named(pid: int, suffix: str, module: str | None = None) -> set[int]:
    """Running processes whose executable name ends with `suffix` (or, with `module`, that run
    `python -m module`) and whose parent is a child of `pid` (e.g. the llama-servers of the shims
    this test process started)."""
    found = set()
    for shim in children(pid):
        try:
            kids = psutil.Process(shim).children()
        except psutil.NoSuchProcess:
            continue
        for k in kids:
            try:  # one read of its command line: a child can exit (a zombie) between two
                argv = k.cmdline() or [""]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if (argv[0].endswith(suffix) or (module is not None and module in argv[1:3])) and _alive(k):
                found.add(k.pid)
    return found


def rss_kib(pid: int | None) -> int:
    """Resident memory in KiB; 0 for a process that is gone (or None)."""
    if pid is None:
        return 0
    try:
        return psutil.Process(pid).memory_info().rss // 1024
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0


def cpu_s(p: psutil.Process) -> float:
    """The user and system CPU seconds a process has spent."""
    t = p.cpu_times()
    return t.user + t.system


def wait_gone(pid: int, timeout: float) -> bool:
    return wait_until(lambda: not running(pid), timeout)


# --- the model tools' workspace ---


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("secret\n")
    (root / "a.txt").write_text("line one\nline two\nneedle here\n")
    (root / "sub" / "b.txt").write_text("deep needle\n")
    (root / "escape").symlink_to(tmp_path / "outside.txt")
    (root / "loop1").symlink_to(root / "loop2")
    (root / "loop2").symlink_to(root / "loop1")
    os.mkfifo(root / "fifo")
    (root / "huge.txt").write_bytes(b"x" * 3_000_000)
    (root / "bin.dat").write_bytes(b"\x7fELF\x00\x01\x02")
    (tmp_path / "linked.txt").write_text("linked secret\n")
    os.link(tmp_path / "linked.txt", root / "hardlink")
    return root


ESCAPES = [
    ("dotdot chain", {"path": "../outside.txt"}, "outside the readable roots"),
    ("long dotdot chain", {"path": "sub/" + "../" * 12 + "etc/passwd"}, "outside the readable roots"),
    ("absolute outside", {"path": "/etc/passwd"}, "outside the readable roots"),
    ("symlink pointing out", {"path": "escape"}, "outside the readable roots"),
    ("symlink loop", {"path": "loop1"}, "no such file"),
    ("hard link to an outside file", {"path": "hardlink"}, "hard links"),
    *([("proc self", {"path": "/proc/self/environ"}, "outside the readable roots")] if sys.platform.startswith("linux") else []),
    ("fifo", {"path": "fifo"}, "not a regular file"),
    ("dev zero", {"path": "/dev/zero"}, "outside the readable roots"),
    ("nul byte", {"path": "a.txt\u0000.png"}, "NUL byte"),
    ("directory to read_file", {"path": "sub"}, "is a directory; use list_directory"),
    ("binary", {"path": "bin.dat"}, "binary file"),
    ("wrong type", {"path": 5}, "'path' must be a string"),
    ("not json", "{path: a.txt", "arguments must be a JSON object"),
]


# --- stand-in cores ---


def fake_core_binary(tmp_path) -> tuple[str, Path]:
    """The fake core behind a wrapper (the shim's --core), and the file its starts are logged in."""
    wrapper = tmp_path / "wisp-core"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_CORE}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), tmp_path / "starts"


def fake_core_starts(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()]


def stub_core(tmp_path, after_ready: str) -> str:
    """A fake wisp-core: says ready, then runs `after_ready` (Python) with `out` = its stdout."""
    stub = tmp_path / "wisp-core"
    stub.write_text(
        f"#!{sys.executable}\n"
        "import json, struct, sys, time\n"
        "out = sys.stdout.buffer\n"
        "def frame(obj):\n"
        "    b = obj if isinstance(obj, bytes) else json.dumps(obj).encode()\n"
        "    out.write(struct.pack('>I', len(b)) + b); out.flush()\n"
        # The shim's own version: it refuses a core of another (test_version.py).
        f"frame({{'id': 0, 'event': 'ready', 'protocol': 2, 'backend': 'stub', 'model': 'stub', 'pid': 0, "
        f"'version': {version()!r}}})\n"
        + after_ready
    )
    stub.chmod(0o755)
    return str(stub)


# --- a stand-in llama-server ---


FAKE_LLAMA = Path(__file__).parents[1] / "fake_llama_server.py"
def install_fake(directory: Path) -> Path:
    """The fake as an executable named llama-server, run by this venv's python."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "llama-server"
    binary.write_text(f"#!{sys.executable}\n" + FAKE_LLAMA.read_text())
    binary.chmod(0o755)
    return binary
