"""Cancellation, time limits, progress, bad arguments and configuration, and the start and
stop of the shim, end to end. Crashes are in test_crashes, garbage from the core in
test_core_garbage."""

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

from harness import REPO, children, core_path, error_text, held, ok, shim_command, shim_env, stub_core, wait_for, wisp


async def test_cancel_frees_the_thread_and_leaves_its_history_unchanged():
    async with wisp() as c:
        ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "t"}))
        never = asyncio.create_task(c.call_tool("respond", {"prompt": "!hold never x", "thread_id": "t"}))
        await held(c, "never")  # running on the thread, and only a cancel can end it
        never.cancel()
        with pytest.raises(asyncio.CancelledError):
            await never
        with anyio.fail_after(30):  # were the thread still held, this would wait for ever
            s = ok(await c.call_tool("respond", {"prompt": "two", "thread_id": "t"}))
        assert s["text"] == "echo 2: two" and s["turns"] == 2  # as if the cancelled call never happened


async def test_time_limit_cancels_and_reports_timeout():
    async with wisp("--timeout", "1") as c:
        ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "t"}))
        start = time.monotonic()
        msg = error_text(await c.call_tool("respond", {"prompt": "!hold never slow", "thread_id": "t"}))  # only the limit ends it
        assert msg.startswith("timeout:"), msg
        assert time.monotonic() - start < 4.5
        s = ok(await c.call_tool("respond", {"prompt": "two", "thread_id": "t"}))
        assert s["text"] == "echo 2: two"


async def test_timeout_from_the_environment():
    async with wisp(env=shim_env(WISP_TIMEOUT="0.5")) as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "!hold never slow"}))
        assert msg.startswith("timeout:"), msg


async def test_progress_notifications_strictly_increase_and_carry_partial_text():
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress, total, message):
        seen.append((progress, message))

    async with wisp() as c:
        # Kept: echo spreads its partials over the sleep, which is what makes progress here.
        r = await c.call_tool("respond", {"prompt": "!sleep 600 streaming reply"}, progress_callback=on_progress)
        final = ok(r)["text"]
        # Notifications race the result over a real transport: the last one carries the whole reply.
        await wait_for(lambda: any((m or "").endswith(final) for _, m in seen), 10)
    assert len(seen) >= 2, seen
    values = [p for p, _ in seen]
    assert all(b > a for a, b in zip(values, values[1:])), values
    # "writing: N tokens, M characters: " and the partial reply (short: all of it), N rising with it.
    parts = [(m or "").removeprefix("writing: ").split(" characters: ", 1) for _, m in seen]
    assert all(len(p) == 2 and final.startswith(p[1]) for p in parts), seen
    counts = [int(n.split(" tokens, ")[0]) for n, _ in parts]
    assert counts == sorted(set(counts)), seen
    assert parts[-1][1] == final and parts[-1][0].endswith(f" {len(final)}"), seen


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


async def test_initialize_and_list_do_not_wait_for_a_slow_core(tmp_path):
    # This core only starts once the test says so: no timing involved.
    go = tmp_path / "go"
    slow = tmp_path / "wisp-core"
    slow.write_text(f"#!/bin/sh\nwhile [ ! -e {go} ]; do sleep 0.05; done\nexec {core_path()} \"$@\"\n")  # kept: the fake's wait for go
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    async with wisp(core=str(slow)) as c:
        with anyio.fail_after(30):
            assert {t.name for t in (await c.list_tools()).tools} >= {"respond", "close_thread"}
        call = asyncio.create_task(c.call_tool("respond", {"prompt": "waited"}))
        # The shim has launched the core and waits for it: that call cannot have an answer yet.
        await wait_for(lambda: any(children(shim) for shim in children(os.getpid())), 30)
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


async def test_a_reply_that_beats_the_cancel_is_returned(tmp_path):
    # The core answers 0.1 s after the limit (and ignores the cancel): the success stands.
    stub = stub_core(tmp_path, (
        "import select\n"
        "def read():\n"
        "    n = struct.unpack('>I', sys.stdin.buffer.read(4))[0]\n"
        "    return json.loads(sys.stdin.buffer.read(n))\n"
        "req = read()\n"
        "time.sleep(1.1)\n"  # kept: this core's lateness is the thing tested
        "frame({'id': req['id'], 'event': 'reply', 'ok': True, 'result': {'op': 'respond', 'thread_id': 'late', 'created': True,"
        " 'text': 'just in time',"
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

    sources = [*sorted((REPO / "python" / "wisp_shim").rglob("*.py")), REPO / "swift" / "WispCore" / "Support" / "Config.swift"]
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


@pytest.mark.parametrize(("args", "env", "says"), [
    (["--max-threads", str(2**63)], {}, "--max-threads: must be at most 1000000"),
    ([], {"WISP_MAX_QUEUE": str(10**30)}, "WISP_MAX_QUEUE: must be at most 1000000"),
    (["--http", "127.0.0.1:0", "--max-sessions", str(2**31)], {"WISP_HTTP_TOKEN": "t" * 32},
     "--max-sessions: must be at most 2147483647"),
])
def test_a_number_past_what_wisp_takes_is_refused_at_start(args, env, says):
    run = subprocess.run([*shim_command("--backend", "echo", *args)], capture_output=True, text=True,
                         timeout=60, env=shim_env(**env), cwd=REPO, stdin=subprocess.DEVNULL)
    assert run.returncode != 0 and says in run.stderr, run.stderr
    assert run.stdout == ""


@pytest.mark.parametrize("flag", ["--max-threads", "--max-queue", "--context-size", "--max-stored-threads",
                                  "--echo-delay-ms"])
def test_the_shims_bound_of_each_core_flag_is_the_cores(flag):
    from harness import core_path
    from wisp_shim.facts import FLAG_MAXIMUMS

    def core_takes(value: int) -> bool:
        run = subprocess.run([core_path(), "--backend", "echo", flag, str(value)], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=60)
        return run.returncode == 0

    assert core_takes(FLAG_MAXIMUMS[flag]) and not core_takes(FLAG_MAXIMUMS[flag] + 1)


def test_unicode_digits_in_the_local_models_numbers_fall_back_to_the_defaults(monkeypatch):
    from wisp_shim.localmodel import llama_server, local_model

    # "²" is a digit to str.isdigit and no number to int(): once a traceback at start.
    for value in ("²", "1" + "0" * 30):
        monkeypatch.setenv("WISP_SLOTS", value)
        monkeypatch.setenv("WISP_LOCAL_CPU_THREADS", value)
        assert 1 <= local_model.slot_count(local_model.slots_wanted(4), 4096, None, None, 2) <= local_model.MAX_SLOTS
        assert 1 <= llama_server.default_cpu_threads() <= llama_server.MAX_CPU_THREADS


# --- signals and stdin EOF with a core that cannot answer ---------------------------------


def _fake_core_argv(tmp_path) -> list[str]:
    wrapper = tmp_path / "wisp-core"
    fake = REPO / "tests" / "python" / "fake_core.py"
    log = tmp_path / "starts"  # and log.stalled once it stalls (fake_core.py)
    wrapper.write_text(f'#!/bin/sh\nWISP_FAKE_CORE_LOG="{log}" exec "{sys.executable}" "{fake}" "$@"\n')
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

    from harness import call, read_until, spawn_initialized, wait_until

    proc = spawn_initialized(argv=_fake_core_argv(tmp_path) if core_state == "wedged" else None)
    shim = psutil.Process(proc.pid)
    [core] = shim.children()
    try:
        prompt = "!stall" if core_state == "wedged" else "!hold never busy"
        proc.stdin.write(call("respond", {"prompt": prompt, "thread_id": "busy"}, 3))
        if core_state == "wedged":
            proc.stdin.flush()
            assert wait_until((tmp_path / "starts.stalled").exists, 10), "the fake core never stalled"
        else:  # the call is in the core, parked
            proc.stdin.write(call("respond", {"prompt": "!held never", "thread_id": "held-never"}, 4))
            proc.stdin.flush()
            read_until(proc, 4, [])
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
