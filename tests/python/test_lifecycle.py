"""Crash recovery, cancellation, time limits, progress and bad arguments, end to end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import subprocess
import sys
import time

import anyio
import pytest

from conftest import REPO, core_path, error_text, ok, shim_command, shim_env, wisp


async def test_crash_fails_pending_calls_restarts_and_reports_lost_threads():
    async with wisp() as c:
        alive = ok(await c.call_tool("respond", {"prompt": "keep me", "thread_id": "alive"}))
        assert alive["created"]
        slow = asyncio.create_task(c.call_tool("respond", {"prompt": "!sleep 10000 slow", "thread_id": "slow"}))
        await asyncio.sleep(0.3)
        start = time.monotonic()
        crash = await c.call_tool("respond", {"prompt": "!crash", "thread_id": "doomed"})
        msg = error_text(crash)
        assert msg.startswith("core_crashed:") and "doomed" in msg and "restarted" in msg
        # The call that was running elsewhere fails at once, not after its 10 s.
        slow_msg = error_text(await slow)
        assert time.monotonic() - start < 5 and slow_msg.startswith("core_crashed:") and "slow" in slow_msg
        # The next call naming a thread that was alive at the crash is told its history is gone...
        lost = error_text(await c.call_tool("respond", {"prompt": "still there?", "thread_id": "alive"}))
        assert lost.startswith("thread_lost:") and "alive" in lost and "lost" in lost
        # ...once: calling again starts a new thread under that id, on the restarted core.
        again = ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "alive"}))
        assert (again["created"], again["text"]) == (True, "echo 1: again")
        # Other work is served normally.
        assert ok(await c.call_tool("respond", {"prompt": "fresh"}))["text"] == "echo 1: fresh"
        assert ok(await c.call_tool("respond", {"prompt": "back", "thread_id": "doomed"}))["created"] is True


async def test_cancel_frees_the_thread_and_leaves_its_history_unchanged():
    async with wisp() as c:
        ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "t"}))
        with anyio.move_on_after(0.5) as scope:
            await c.call_tool("respond", {"prompt": "!sleep 10000 never", "thread_id": "t"})
        assert scope.cancelled_caught
        start = time.monotonic()
        s = ok(await c.call_tool("respond", {"prompt": "two", "thread_id": "t"}))
        assert time.monotonic() - start < 3.0, "the cancelled call still held the thread"
        assert s["text"] == "echo 2: two" and s["turns"] == 2  # as if the cancelled call never happened


async def test_time_limit_cancels_and_reports_timeout():
    async with wisp("--timeout", "1") as c:
        ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "t"}))
        start = time.monotonic()
        msg = error_text(await c.call_tool("respond", {"prompt": "!sleep 10000 slow", "thread_id": "t"}))
        assert msg.startswith("timeout:"), msg
        assert time.monotonic() - start < 4.5
        s = ok(await c.call_tool("respond", {"prompt": "two", "thread_id": "t"}))
        assert s["text"] == "echo 2: two"


async def test_timeout_from_the_environment():
    async with wisp(env=shim_env(WISP_TIMEOUT="0.5")) as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "!sleep 5000 slow"}))
        assert msg.startswith("timeout:"), msg


async def test_progress_notifications_strictly_increase_and_carry_partial_text():
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress, total, message):
        seen.append((progress, message))

    async with wisp() as c:
        r = await c.call_tool("respond", {"prompt": "!sleep 600 streaming reply"}, progress_callback=on_progress)
        final = ok(r)["text"]
        await asyncio.sleep(0.1)  # notifications race the result over a real transport
    assert len(seen) >= 2, seen
    values = [p for p, _ in seen]
    assert all(b > a for a, b in zip(values, values[1:])), values
    assert all(m and final.startswith(m) for _, m in seen), seen
    assert seen[-1][1] == final


BAD_ARGUMENTS = [
    ({}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"prompt": ["a"]}, "prompt"),
    ({"prompt": "x", "thread_id": "has space"}, "thread_id"),
    ({"prompt": "x", "thread_id": "a/b"}, "thread_id"),
    ({"prompt": "x", "thread_id": ""}, "thread_id"),
    ({"prompt": "x", "thread_id": "a" * 65}, "thread_id"),
    ({"prompt": "x", "thread_id": 12}, "thread_id"),
    ({"prompt": "x", "instructions": 3}, "instructions"),
    ({"prompt": "x", "tools": "read_file"}, "tools"),
    ({"prompt": "x", "tools": [1]}, "tools"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"prompt": "x", "max_output_tokens": 2.5}, "max_output_tokens"),
    ({"prompt": "x", "max_output_tokens": True}, "max_output_tokens"),
    ({"prompt": "x", "colour": "red"}, "colour"),
]


async def test_bad_arguments_are_clear_tool_errors_and_the_server_lives_on():
    async with wisp() as c:
        for args, field in BAD_ARGUMENTS:
            msg = error_text(await c.call_tool("respond", args))
            assert msg.startswith("invalid_argument:") and field in msg, (args, msg)
        for args in ({}, {"thread_id": "a b"}, {"thread_id": 7}):
            assert error_text(await c.call_tool("close_thread", args)).startswith("invalid_argument:")
        assert ok(await c.call_tool("respond", {"prompt": "still alive"}))["text"] == "echo 1: still alive"


async def test_a_prompt_over_the_pipe_limit_is_refused_by_the_shim():
    async with wisp() as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "x" * (16 * 1024 * 1024 + 10)}))
        assert msg.startswith("invalid_argument:") and "MiB" in msg
        # The core was not killed by an oversized frame: a thread made before survives.
        assert ok(await c.call_tool("respond", {"prompt": "after", "thread_id": "t"}))["text"] == "echo 1: after"
        assert ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "t"}))["text"] == "echo 2: again"


async def test_unknown_tool_is_a_protocol_error():
    from mcp import MCPError

    async with wisp() as c:
        with pytest.raises(MCPError, match="Unknown tool"):
            await c.call_tool("no_such_tool", {})


async def test_missing_core_is_a_tool_error_that_says_how_to_build_it(tmp_path):
    async with wisp(core=str(tmp_path / "wisp-core")) as c:
        assert {t.name for t in (await c.list_tools()).tools} >= {"respond", "close_thread"}
        msg = error_text(await c.call_tool("respond", {"prompt": "hi"}))
        assert "make build" in msg and "wisp-core" in msg


async def test_core_that_dies_before_ready_is_a_tool_error_not_a_hang(tmp_path):
    broken = tmp_path / "wisp-core"
    broken.write_text("#!/bin/sh\necho 'broken core' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    async with wisp(core=str(broken)) as c:
        with anyio.fail_after(10):
            msg = error_text(await c.call_tool("respond", {"prompt": "hi"}))
        assert msg.startswith("core_unavailable:") and "status 3" in msg


async def test_initialize_and_list_do_not_wait_for_a_slow_core(tmp_path):
    # This core only starts once the test says so: no timing involved.
    go = tmp_path / "go"
    slow = tmp_path / "wisp-core"
    slow.write_text(f"#!/bin/sh\nwhile [ ! -e {go} ]; do sleep 0.05; done\nexec {core_path()} \"$@\"\n")
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    async with wisp(core=str(slow)) as c:
        with anyio.fail_after(30):
            assert {t.name for t in (await c.list_tools()).tools} >= {"respond", "close_thread"}
        call = asyncio.create_task(c.call_tool("respond", {"prompt": "waited"}))
        await asyncio.sleep(0.5)
        assert not call.done(), "respond answered before the core existed"
        go.touch()
        with anyio.fail_after(30):
            assert ok(await call)["text"] == "echo 1: waited"


def test_check_reports_the_backend():
    run = subprocess.run([*shim_command("--backend", "echo", "--check")], capture_output=True, text=True, timeout=60, env=shim_env(), cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "backend:      echo" in run.stdout and "available:    yes" in run.stdout
    if sys.platform != "darwin":
        # Apple's model is the default wherever it runs, so --check says why it is not in use.
        assert "apple model:  not available (the apple backend needs macOS 26+" in run.stdout


def test_check_apple_on_linux_says_why_and_exits_1():
    if sys.platform == "darwin":
        pytest.skip("on a Mac the apple backend may well be available")
    run = subprocess.run([*shim_command("--backend", "apple", "--check")], capture_output=True, text=True, timeout=60, env=shim_env(), cwd=REPO)
    assert run.returncode == 1
    assert "backend:      apple" in run.stdout and "available:    no (the apple backend needs macOS 26+" in run.stdout


def test_help_is_actionable():
    run = subprocess.run([sys.executable, "-m", "wisp_shim", "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0
    for word in ("--backend", "WISP_BACKEND", "--timeout", "WISP_TIMEOUT", "--core", "make build", "--check"):
        assert word in run.stdout, word


def _stub_core(tmp_path, after_ready: str) -> str:
    """A fake wisp-core: says ready, then runs `after_ready` (Python) with `out` = its stdout."""
    stub = tmp_path / "wisp-core"
    stub.write_text(
        f"#!{sys.executable}\n"
        "import json, struct, sys, time\n"
        "out = sys.stdout.buffer\n"
        "def frame(obj):\n"
        "    b = obj if isinstance(obj, bytes) else json.dumps(obj).encode()\n"
        "    out.write(struct.pack('>I', len(b)) + b); out.flush()\n"
        "frame({'id': 0, 'event': 'ready', 'protocol': 1, 'backend': 'stub', 'model': 'stub', 'pid': 0})\n"
        + after_ready
    )
    stub.chmod(0o755)
    return str(stub)


async def test_shim_time_limit_catches_a_core_that_stops_answering(tmp_path):
    # The core never replies: only the shim's own timer can end the call, and it fires at the
    # user's limit (plus the 0.25 s given to a reply racing the cancel), not at limit + 3 s.
    stub = _stub_core(tmp_path, "sys.stdin.buffer.read()\n")
    async with wisp("--timeout", "0.5", core=stub) as c:
        start = time.monotonic()
        with anyio.fail_after(10):
            msg = error_text(await c.call_tool("respond", {"prompt": "anyone?", "thread_id": "t"}))
        took = time.monotonic() - start
        assert msg.startswith("timeout: no reply within 0.5 s; the call was stopped and thread 't' is unchanged"), msg
        assert 0.5 <= took < 1.5, took


async def test_garbage_from_the_core_fails_calls_and_restarts_it(tmp_path):
    stub = _stub_core(tmp_path, "time.sleep(0.3)\nframe(b'this is not json')\nsys.stdin.buffer.read()\n")
    async with wisp(core=stub) as c:
        with anyio.fail_after(10):
            msg = error_text(await c.call_tool("respond", {"prompt": "hi", "thread_id": "t"}))
        assert msg.startswith("core_crashed:") and "protocol error" in msg, msg


async def test_wrong_protocol_version_is_refused(tmp_path):
    stub = tmp_path / "wisp-core"
    stub.write_text(
        f"#!{sys.executable}\nimport json, struct, sys\n"
        "b = json.dumps({'id': 0, 'event': 'ready', 'protocol': 99, 'backend': 's', 'model': 's', 'pid': 0}).encode()\n"
        "sys.stdout.buffer.write(struct.pack('>I', len(b)) + b); sys.stdout.buffer.flush(); sys.stdin.buffer.read()\n"
    )
    stub.chmod(0o755)
    async with wisp(core=str(stub)) as c:
        with anyio.fail_after(10):
            msg = error_text(await c.call_tool("respond", {"prompt": "hi"}))
        assert msg.startswith("core_unavailable:") and "protocol 99" in msg, msg


async def test_a_core_killed_while_idle_loses_every_live_thread():
    from test_process import children

    async with wisp() as c:
        for tid in ("a", "b"):
            ok(await c.call_tool("respond", {"prompt": "hello", "thread_id": tid}))
        ok(await c.call_tool("close_thread", {"thread_id": "b"}))
        cores = [k for shim in children(os.getpid()) for k in children(shim)]
        assert len(cores) == 1, cores
        os.kill(cores[0], signal.SIGKILL)
        await asyncio.sleep(0.5)
        msg = error_text(await c.call_tool("respond", {"prompt": "still?", "thread_id": "a"}))
        assert msg.startswith("thread_lost:"), msg
        # b was closed before the crash: nothing was lost, it simply starts anew.
        s = ok(await c.call_tool("respond", {"prompt": "new", "thread_id": "b"}))
        assert (s["created"], s["text"]) == (True, "echo 1: new")
        assert ok(await c.call_tool("respond", {"prompt": "again", "thread_id": "a"}))["text"] == "echo 1: again"


@pytest.mark.parametrize("args, env, message", [
    (["--max-threads", "0"], {}, "--max-threads: must be at least 1"),
    (["--context-size", "many"], {}, "--context-size: expected an integer"),
    ([], {"WISP_MAX_THREADS": "-3"}, "WISP_MAX_THREADS: must be at least 1"),
])
def test_bad_configuration_is_refused_at_start_with_a_clear_message(args, env, message):
    run = subprocess.run([*shim_command("--backend", "echo", *args)], capture_output=True, text=True, timeout=60,
                         env=shim_env(**env), cwd=REPO, stdin=subprocess.DEVNULL)
    assert run.returncode != 0
    assert message in run.stderr
    assert run.stdout == ""


async def test_a_thread_closed_while_a_call_runs_is_not_reported_lost_later():
    async with wisp() as c:
        ok(await c.call_tool("respond", {"prompt": "hello", "thread_id": "x"}))
        async with anyio.create_task_group() as tg:
            results = []

            async def slow() -> None:
                results.append(ok(await c.call_tool("respond", {"prompt": "!sleep 600 busy", "thread_id": "x"})))

            tg.start_soon(slow)
            await anyio.sleep(0.2)
            assert ok(await c.call_tool("close_thread", {"thread_id": "x"}))["closed"] is True
        assert results[0]["text"] == "echo 2: !sleep 600 busy"  # an accepted call still finishes
        error_text(await c.call_tool("respond", {"prompt": "!crash", "thread_id": "other"}))
        # x was closed before the crash, so nothing of it was lost: it simply starts anew.
        s = ok(await c.call_tool("respond", {"prompt": "new", "thread_id": "x"}))
        assert (s["created"], s["text"]) == (True, "echo 1: new")


async def test_the_time_limit_holds_while_the_core_is_stopped():
    """--timeout 2 with the core SIGSTOPped mid-call: the timeout arrives at the user's limit
    and names it; once the core runs again, the timed-out turn was not kept."""
    import psutil

    from test_faults import _core_pids

    async with wisp("--timeout", "2") as c:
        assert ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "t"}))["text"] == "echo 1: one"
        core = psutil.Process(_core_pids(c)[-1])
        call = asyncio.create_task(c.call_tool("respond", {"prompt": "!sleep 3000 slow", "thread_id": "t"}))
        start = time.monotonic()
        await asyncio.sleep(0.3)
        core.suspend()
        try:
            msg = error_text(await asyncio.wait_for(call, 10))
            took = time.monotonic() - start
            # Resumed after the 3 s sleep would have ended: only the core's commit-time check
            # of the deadline (timeout_s, which the shim always sends) keeps that turn out.
            await asyncio.sleep(max(0.0, 3.5 - (time.monotonic() - start)))
        finally:
            core.resume()
        assert msg == (
            "timeout: no reply within 2 s; the call was stopped and thread 't' is unchanged. "
            "(--timeout / WISP_TIMEOUT sets the limit for respond.)"
        ), msg
        assert 2.0 <= took < 2.5, took
        assert ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "two", "thread_id": "t"}), 10))["text"] == "echo 2: two"


async def test_a_reply_that_beats_the_cancel_is_returned(tmp_path):
    # The core answers 0.1 s after the limit (and ignores the cancel): the success stands.
    stub = _stub_core(tmp_path, (
        "import select\n"
        "def read():\n"
        "    n = struct.unpack('>I', sys.stdin.buffer.read(4))[0]\n"
        "    return json.loads(sys.stdin.buffer.read(n))\n"
        "req = read()\n"
        "time.sleep(1.1)\n"
        "frame({'id': req['id'], 'ok': True, 'result': {'thread_id': 'late', 'created': True, 'text': 'just in time',"
        " 'condensed': False, 'turns': 1, 'dropped': 0}})\n"
        "sys.stdin.buffer.read()\n"
    ))
    async with wisp("--timeout", "1", core=stub) as c:
        r = ok(await asyncio.wait_for(c.call_tool("respond", {"prompt": "hurry", "thread_id": "late"}), 10))
        assert r["text"] == "just in time"


def test_help_lists_every_environment_variable_wisp_reads():
    # Every WISP_* name that the package or the core's configuration reads (a quoted literal
    # is a read there, or the name handed to one), against what --help says.
    import re

    sources = [*sorted((REPO / "python" / "wisp_shim").glob("*.py")), REPO / "swift" / "WispCore" / "Support" / "Config.swift"]
    read = set()
    for path in sources:
        read |= set(re.findall(r"[\"'](WISP_[A-Z_]+)[\"']", path.read_text()))
    assert {"WISP_ROOTS", "WISP_LOCAL_MODEL", "WISP_LOCAL_THREADS", "WISP_API_KEY", "WISP_TIMEOUT"} <= read, read
    run = subprocess.run([sys.executable, "-m", "wisp_shim", "--help"], capture_output=True, text=True, timeout=60)
    listed = set(re.findall(r"WISP_[A-Z_]+", run.stdout))
    assert read - listed == set(), f"read by wisp but not in --help: {sorted(read - listed)}"


@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "-1", "0"])
def test_a_time_limit_that_is_not_a_finite_positive_number_is_refused(value):
    run = subprocess.run([*shim_command("--backend", "echo", "--timeout", value)], capture_output=True, text=True,
                         timeout=60, env=shim_env(), cwd=REPO, stdin=subprocess.DEVNULL)
    assert run.returncode != 0 and "--timeout / WISP_TIMEOUT must be a finite number of seconds above 0" in run.stderr, run.stderr
    assert run.stdout == ""


# --- signals and stdin EOF with a core that cannot answer ---------------------------------


def _fake_core_argv(tmp_path) -> list[str]:
    wrapper = tmp_path / "wisp-core"
    fake = REPO / "tests" / "python" / "fake_core.py"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    wrapper.chmod(0o755)
    return shim_command("--backend", "echo", core=str(wrapper))


@pytest.mark.parametrize("how, core_state", [
    ("SIGTERM", "stopped"), ("SIGHUP", "stopped"), ("SIGQUIT", "stopped"), ("SIGINT", "stopped"), ("stdin-eof", "stopped"),
    ("SIGHUP", "wedged"), ("SIGQUIT", "wedged"), ("stdin-eof", "wedged"),
])
def test_stopping_wisp_with_a_stopped_or_wedged_core_leaves_no_orphan(tmp_path, how, core_state):
    """SIGHUP and SIGQUIT are handled like SIGTERM, and every way of stopping wisp ends the
    core within 2 s even when it is SIGSTOPped or wedged (it neither reads nor answers)."""
    import psutil

    from test_process import call, spawn_initialized

    proc = spawn_initialized(argv=_fake_core_argv(tmp_path) if core_state == "wedged" else None)
    shim = psutil.Process(proc.pid)
    [core] = shim.children()
    try:
        prompt = "!stall" if core_state == "wedged" else "!sleep 30000 busy"
        proc.stdin.write(call("respond", {"prompt": prompt, "thread_id": "busy"}, 3))
        proc.stdin.flush()
        time.sleep(0.3)
        if core_state == "stopped":
            core.suspend()
        start = time.monotonic()
        if how == "stdin-eof":
            proc.stdin.close()
        else:
            proc.send_signal(getattr(signal, how))
        proc.wait(timeout=5)
        gone = psutil.wait_procs([core], timeout=max(0.0, 2.0 - (time.monotonic() - start)))[0]
        took = time.monotonic() - start
        assert gone, f"wisp-core {core.pid} outlived the shim's {how} ({core_state})"
        assert took < 2.0, f"{how} with a {core_state} core: {took:.2f} s"
        assert proc.returncode == 0, proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(psutil.NoSuchProcess):
            core.kill()
