"""`--store URL` (PostgreSQL), end to end on a real PostgreSQL of the test's own (initdb).

- The URL is taken from the flag or WISP_STORE, refused beside --state-dir naming both, and its
  password never shown: not in the shim's or the core's log (debug included), `--check`, an error
  or a reply, whether the database is reachable or not.
- Two wisps on one database share threads: each continues, reads, lists and searches what the
  other wrote, and a thread closed on one starts afresh on the other.
- A wisp killed with SIGKILL while it holds a thread's lease frees it within 5 s, and its turn is kept
  nowhere.
- Fail closed: the database stopped, a call fails `store_unavailable` naming it, and its turn is
  kept nowhere; calls work again within 10 s of the database's return, with no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time

import pytest

from harness import echo_n, core_pids, error_text, errlog_text, held, ok, shim_command, shim_env, wisp
from harness.postgres import postgres

PASSWORD = "pw-7f3c9e-never-shown"


def run_check(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(shim_command("--backend", "echo", "--check", "--log-level", "debug", *args),
                          env=shim_env(**env), capture_output=True, text=True, timeout=120)


def assert_hidden(p: subprocess.CompletedProcess) -> None:
    assert PASSWORD not in p.stdout and PASSWORD not in p.stderr, (p.stdout, p.stderr)


async def say(c, tid: str, prompt: str) -> dict:
    return ok(await c.call_tool("respond", {"prompt": prompt, "thread_id": tid}))


def test_state_dir_and_store_together_refused_naming_both(tmp_path):
    url = f"postgresql://wisp:{PASSWORD}@/db?host={tmp_path}"
    p = run_check("--state-dir", str(tmp_path / "s"), "--store", url)
    assert p.returncode != 0
    assert "--state-dir" in p.stderr and "--store" in p.stderr and "both given" in p.stderr, p.stderr
    assert "postgresql://wisp:***@/db" in p.stderr
    assert_hidden(p)


def test_store_from_the_environment_refused_beside_state_dir(tmp_path):
    p = run_check(WISP_STORE=f"postgres://u:{PASSWORD}@h/db", WISP_STATE_DIR=str(tmp_path / "s"))
    assert p.returncode != 0 and "both given" in p.stderr, p.stderr
    assert_hidden(p)


@pytest.mark.parametrize("url", ["mysql://u:{pw}@h/db", "{pw}"])
def test_not_a_postgresql_url_refused_without_quoting_it(url):
    p = run_check("--store", url.format(pw=PASSWORD))
    assert p.returncode != 0 and "postgresql:// or postgres://" in p.stderr, p.stderr
    assert_hidden(p)


def test_password_never_shown_reachable_or_not():
    with postgres() as pg:
        for url in (pg.url(PASSWORD), pg.url() + f"&password={PASSWORD}"):
            p = run_check("--store", url)
            assert p.returncode == 0, p.stderr
            assert "database postgresql://wisp" in p.stdout and "not usable" not in p.stdout, p.stdout
            assert_hidden(p)
        pg.stop()
        p = run_check("--store", pg.url(PASSWORD))
        assert "not usable now" in p.stdout and str(pg.root) in p.stdout, p.stdout
        assert_hidden(p)
        pg.start()


def store_line(p: subprocess.CompletedProcess) -> str:
    return next(line for line in p.stdout.splitlines() if line.startswith("store:"))


def test_check_states_the_engine_the_servers_version_and_the_schemas():
    with postgres() as pg:
        p = run_check("--store", pg.url(PASSWORD))
        assert p.returncode == 0, p.stderr
        # Asked of the server itself: "15.14 (Debian 15.14-0+deb12u1)" is version 15.14.
        server = pg.sql("SHOW server_version").split()[0]
        schema = pg.sql("SELECT version FROM wisp_schema")
        assert f"store:        postgresql {server}, wisp schema {schema}, database postgresql://wisp:***@" \
            in p.stdout, p.stdout
        assert_hidden(p)


def test_check_against_an_unreachable_port_says_why_and_never_the_password(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # no server listens on it, nor on a socket in tmp_path
    p = run_check("--store", f"postgresql://wisp:{PASSWORD}@/postgres?host={tmp_path}&port={port}")
    assert p.returncode == 0, p.stderr
    line = store_line(p)
    try:
        ctypes.CDLL("libpq.so.5")
    except OSError:
        # No libpq here: what --check says instead is what to install.
        assert "postgresql (libpq is not installed)" in line and "libpq5" in p.stdout, p.stdout
    else:
        assert line.startswith("store:        postgresql (the server was not reached), database "), line
        assert f"port={port}" in line and "not usable now" in line and "connection to server" in p.stdout, p.stdout
    assert_hidden(p)


async def test_two_wisps_on_one_database_share_threads():
    with postgres() as pg:
        url = pg.url(PASSWORD)
        async with wisp("--store", url) as a, wisp("--store", url) as b:
            assert echo_n(await say(a, "shared", "zebra crossing")) == 1
            # B continues A's thread, and A then B's: neither loses or reorders a turn.
            assert echo_n(await say(b, "shared", "quokka island")) == 2
            assert echo_n(await say(a, "shared", "third")) == 3
            read = ok(await b.call_tool("read_thread", {"thread_id": "shared"}))
            assert [t["prompt"] for t in read["items"]] == ["zebra crossing", "quokka island", "third"], read
            listed = ok(await a.call_tool("list_threads", {}))
            assert [t["thread_id"] for t in listed["threads"]] == ["shared"], listed
            for c in (a, b):
                found = ok(await c.call_tool("list_threads", {"query": "quokka"}))
                assert [t["thread_id"] for t in found["threads"]] == ["shared"], found
                none = ok(await c.call_tool("list_threads", {"query": "quokka absent"}))
                assert none["threads"] == [], none
            ok(await a.call_tool("close_thread", {"thread_id": "shared"}))
            assert echo_n(await say(b, "shared", "afresh")) == 1
            for c in (a, b):
                assert PASSWORD not in errlog_text(c.errlog)
            # What the tools say of retention is this store's, not the memory-only wording.
            respond = next(t for t in (await a.list_tools()).tools if t.name == "respond")
            assert "in PostgreSQL (--store)" in (respond.description or ""), respond.description
            assert "lost when wisp restarts" not in (respond.description or "")


async def test_a_killed_wisp_frees_its_threads_within_5_s():
    with postgres() as pg:
        url = pg.url()
        async with wisp("--store", url) as a, wisp("--store", url) as b:
            await say(a, "t", "one")
            # A call parked on thread t holds t's lease in A until A is killed.
            parked = asyncio.create_task(a.call_tool("respond", {"prompt": "!hold k", "thread_id": "t"}))
            await held(a, "k")
            busy = await b.call_tool("respond", {"prompt": "meanwhile", "thread_id": "t"})
            assert "busy" in error_text(busy), error_text(busy)
            for pid in core_pids(a):
                os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            while True:
                r = await b.call_tool("respond", {"prompt": "after", "thread_id": "t"})
                if not r.is_error:
                    break
                assert error_text(r).startswith("busy") and time.monotonic() - killed < 5, error_text(r)
            assert echo_n(ok(r)) == 2
            # The killed turn is kept nowhere: the thread is its first turn and the one after.
            read = ok(await b.call_tool("read_thread", {"thread_id": "t"}))
            assert [t["prompt"] for t in read["items"]] == ["one", "after"], read
            parked.cancel()
            with contextlib.suppress(BaseException):
                await parked


async def test_the_database_gone_fails_closed_and_comes_back_without_restart():
    with postgres() as pg:
        async with wisp("--store", pg.url(PASSWORD)) as c:
            assert echo_n(await say(c, "t", "one")) == 1
            pg.stop()
            r = await c.call_tool("respond", {"prompt": "lost", "thread_id": "t"})
            text = error_text(r)
            assert "store_unavailable" in text and str(pg.root) in text and PASSWORD not in text, text
            pg.start()
            back = time.monotonic()
            while True:
                r = await c.call_tool("respond", {"prompt": "two", "thread_id": "t"})
                if not r.is_error:
                    break
                assert time.monotonic() - back < 10, error_text(r)
            # The lost call's turn was kept nowhere: this is the thread's second turn.
            assert echo_n(ok(r)) == 2
            read = ok(await c.call_tool("read_thread", {"thread_id": "t"}))
            assert [t["prompt"] for t in read["items"]] == ["one", "two"], read
            assert PASSWORD not in errlog_text(c.errlog)
