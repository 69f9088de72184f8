"""The shim as a process: stdout carries JSON-RPC only, and no wisp-core outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time

import psutil
import pytest

from harness import (INITIALIZE, INITIALIZED, REPO, call, children, held_args, jsonrpc, read_until, running, shim_command,
                     shim_env, spawn, spawn_initialized, wait_gone, wait_until)


def test_stdout_carries_only_json_rpc():
    with tempfile.TemporaryFile() as err:
        proc = spawn("--log-level", "debug", stderr=err)
        lines: list[bytes] = []
        try:
            proc.stdin.write(INITIALIZE)
            proc.stdin.flush()
            assert "result" in read_until(proc, 1, lines)
            proc.stdin.write(INITIALIZED)
            requests = [
                jsonrpc("tools/list", {}, id=2),
                call("respond", {"prompt": "hello", "thread_id": "t"}, 3),
                call("respond", {"prompt": "!sleep 300 progress"}, 4, progress_token="tok"),  # kept: its partials are the progress
                call("respond", {"prompt": 5}, 5),
                call("respond", {"prompt": "!fail internal"}, 6),
                call("close_thread", {"thread_id": "t"}, 7),
                call("list_threads", {}, 8),
            ]
            for i, req in enumerate(requests, start=2):
                proc.stdin.write(req)
                proc.stdin.flush()
                read_until(proc, i, lines)
            proc.stdin.write(call("respond", {"prompt": "!crash"}, 9))
            proc.stdin.flush()
            assert read_until(proc, 9, lines)["result"]["isError"] is True
            proc.stdin.write(call("respond", {"prompt": "after the crash"}, 10))
            proc.stdin.flush()
            assert not read_until(proc, 10, lines)["result"].get("isError")
            proc.stdin.close()
            lines += proc.stdout.read().splitlines(keepends=True)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
        err.seek(0)
        log = err.read().decode()
    assert proc.returncode == 0
    for line in lines:
        assert line.endswith(b"\n")
        msg = json.loads(line)
        assert msg.get("jsonrpc") == "2.0" and ("id" in msg or "method" in msg), line
    # Progress went only to the call that asked for it, strictly increasing.
    progress = [json.loads(x)["params"] for x in lines if json.loads(x).get("method") == "notifications/progress"]
    assert len(progress) >= 2 and {p["progressToken"] for p in progress} == {"tok"}
    assert all(b["progress"] > a["progress"] for a, b in zip(progress, progress[1:]))
    # The logs went somewhere: stderr, from both the shim and the core.
    assert "wisp-core" in log and "wisp INFO" in log


def _name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return ""


def _start_with_core(*args: str) -> tuple[subprocess.Popen, int]:
    proc = spawn_initialized(*args)
    # A call left running in the core, parked and never released, so shutdown cannot wait for quiet.
    proc.stdin.write(call("respond", {"prompt": "!hold never busy"}, 3) + call("respond", held_args("never"), 4))
    proc.stdin.flush()
    read_until(proc, 4, [])
    cores = children(proc.pid)
    assert len(cores) == 1, cores
    return proc, cores[0]


@pytest.mark.parametrize("how", ["stdin-eof", "sigterm", "sigint", "sigkill"])
def test_no_orphaned_core(how):
    proc, core = _start_with_core()
    try:
        start = time.monotonic()
        if how == "stdin-eof":
            proc.stdin.close()
        elif how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        elif how == "sigint":
            proc.send_signal(signal.SIGINT)
        else:
            proc.kill()
        proc.wait(timeout=5)
        assert wait_gone(core, 5), f"wisp-core {core} still running after the shim's {how}"
        elapsed = time.monotonic() - start
        # The core gets 0.5 s after EOF before SIGTERM; anything near 2.5 s means it needed SIGTERM.
        assert elapsed < 2.4, f"{how}: took {elapsed:.2f} s"
        if how != "sigkill":
            assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if running(core):
            os.kill(core, signal.SIGKILL)


@pytest.mark.parametrize("how", ["stdin-eof", "sigterm"])
def test_a_core_that_ignores_eof_and_sigterm_is_killed(tmp_path, how):
    # The shim must not rely on the core's good manners: close stdin, SIGTERM, then SIGKILL.
    import struct

    from wisp_shim.version import version

    ready = json.dumps({"id": 0, "event": "ready", "protocol": 2, "backend": "stub", "model": "stub", "pid": 0,
                        "version": version()}).encode()
    (tmp_path / "ready").write_bytes(struct.pack(">I", len(ready)) + ready)
    stub = tmp_path / "wisp-core"
    # Kept: a core asleep, deaf to EOF and SIGTERM, is this fake's behaviour.
    stub.write_text(f"#!/bin/sh\ntrap '' TERM\ncat {tmp_path / 'ready'}\nexec sleep 60 < /dev/null\n")
    stub.chmod(0o755)
    proc = subprocess.Popen(
        shim_command("--backend", "echo", core=str(stub)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=shim_env(), cwd=REPO,
    )
    lines: list[bytes] = []
    core = None
    try:
        proc.stdin.write(INITIALIZE)
        proc.stdin.flush()
        read_until(proc, 1, lines)
        proc.stdin.write(INITIALIZED + call("list_threads", {}, 2))
        proc.stdin.flush()
        assert wait_until(lambda: children(proc.pid), 10), "the shim started no core"
        core = children(proc.pid)[0]
        # It has printed ready and settled into sleep (SIGTERM still ignored) once it runs as `sleep`.
        assert wait_until(lambda: _name(core) == "sleep", 10), _name(core)
        start = time.monotonic()
        if how == "stdin-eof":
            proc.stdin.close()
        else:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=6)
        assert wait_gone(core, 1), "the stubborn core outlived the shim"
        assert time.monotonic() - start < 5.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if core is not None and running(core):
            os.kill(core, signal.SIGKILL)
