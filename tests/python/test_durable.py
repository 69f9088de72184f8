"""Durable threads: `--state-dir` through the real shim and core, echo backend.

The echo backend's `echo N:` is the number of prompts the thread's context holds, so a thread
that continues with its full history after a crash or restart says so in its reply.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path


from harness import echo_n, REPO, core_path, core_pids, error_text, held, ok, shim_env, text_of, wait_for, wisp

sys.path.insert(0, str(REPO / "python"))
from wisp_shim.core import protocol  # noqa: E402


def stored(state: Path) -> dict[str, dict]:
    """Every stored thread, read from the state dir's database as the core reads it
    (SQLiteThreadStore.swift, StoreSchema.swift): the binding and the turns in order."""
    db = sqlite3.connect(state / "threads.db")
    try:
        out = {}
        for tid, instructions, tools, roots, turns in db.execute("SELECT id, instructions, tools, roots, turns FROM threads WHERE id NOT LIKE '!%'"):
            history = [{"prompt": p, "response": r, "tokens": t}
                       for p, r, t in db.execute("SELECT prompt, response, tokens FROM turns WHERE thread_id = ? ORDER BY seq", (tid,))]
            assert len(history) == turns, (tid, len(history), turns)
            out[tid] = {"id": tid, "instructions": instructions, "tools": json.loads(tools), "roots": json.loads(roots), "history": history}
        return out
    finally:
        db.close()


def write_thread_file(state: Path, tid: str, turns: int, instructions: str | None = None, tokens: int = 3) -> None:
    """A thread file of format 2, as wisps before the SQLite store wrote them."""
    lines = [json.dumps({"format": 2, "id": tid, "written": 1.5, "instructions": instructions, "tools": [], "roots": []})]
    for i in range(turns):
        lines.append(json.dumps({"prompt": f"p{i}", "toolExchanges": [], "response": f"echo {i + 1}: p{i}", "tokens": tokens}))
        lines.append(json.dumps({"turns": i + 1, "written": 1.5 + i}))
    (state / f"thread-{tid}.json").write_text("\n".join(lines) + "\n")


async def say(c, tid: str, prompt: str) -> dict:
    return ok(await c.call_tool("respond", {"prompt": prompt, "thread_id": tid}))


async def test_a_restarted_server_continues_every_thread_with_its_binding(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state)) as c:
        first = ok(await c.call_tool("respond", {"prompt": "one", "thread_id": "a", "instructions": "be brief"}))
        assert first["created"]
        await say(c, "a", "two")
        await say(c, "b", "only")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert sorted(stored(state)) == ["a", "b"]
    for f in state.glob("threads.*"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert stored(state)["a"]["instructions"] == "be brief"

    async with wisp("--state-dir", str(state)) as c:
        listed = ok(await c.call_tool("list_threads", {}))["threads"]
        assert {(t["thread_id"], t["turns"], t["live"], t["stored"]) for t in listed} == {("a", 2, False, True), ("b", 1, False, True)}
        r = await say(c, "a", "three")
        assert (r["created"], echo_n(r), r["turns"]) == (False, 3, 3)
        # The binding came back with the history: passing it again is refused, as for a live thread.
        refused = await c.call_tool("respond", {"prompt": "x", "thread_id": "a", "instructions": "other"})
        assert "be brief" in error_text(refused)
        assert echo_n(await say(c, "b", "again")) == 2


async def test_kill_9_of_the_core_between_and_during_calls_loses_no_thread(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state)) as c:
        for tid in ("x", "y", "z"):
            for i in range(3):
                await say(c, tid, f"{tid}{i}")
        os.kill(core_pids(c)[-1], signal.SIGKILL)
        await wait_for(lambda: len(core_pids(c)) == 2, 10)
        for tid in ("x", "y"):
            r = await say(c, tid, "after the crash")
            assert (r["created"], echo_n(r)) == (False, 4), r

        # Mid-call: the running call fails, its thread keeps every turn answered before it.
        slow = asyncio.create_task(c.call_tool("respond", {"prompt": "!hold never slow", "thread_id": "y"}))
        await held(c, "never")  # running, never released: the crash ends it
        os.kill(core_pids(c)[-1], signal.SIGKILL)
        failed = error_text(await asyncio.wait_for(slow, 10))
        assert failed.startswith("core_crashed") and "is stored" in failed, failed
        for tid, n in (("x", 5), ("y", 5), ("z", 4)):
            r = await say(c, tid, "after the second crash")
            assert (r["created"], echo_n(r)) == (False, n), (tid, r)


def _spawn_core(state: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen([core_path(), "--backend", "echo", "--state-dir", str(state), *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=shim_env())
    ready = _read_frame(proc)
    assert ready["event"] == "ready" and ready["durable"] is True
    return proc


def _read_frame(proc: subprocess.Popen) -> dict | None:
    header = proc.stdout.read(4)
    if len(header) < 4:
        return None
    (n,) = protocol._HEADER.unpack(header)
    body = proc.stdout.read(n)
    return json.loads(body) if len(body) == n else None


def test_kill_9_during_state_writes_leaves_every_file_old_or_new(tmp_path):
    """Many trials: a core storing turns as fast as it can is SIGKILLed at a random instant;
    every stored thread then holds whole turns, never fewer than were answered, at most one more."""
    state = tmp_path / "state"
    threads = ["t0", "t1", "t2"]
    acked = dict.fromkeys(threads, 0)
    rng = random.Random(18)
    big = "w" * 20000  # a larger turn takes longer to write, so kills land inside writes
    trials = int(os.environ.get("WISP_KILL_TRIALS", "40"))
    for trial in range(trials):
        # A context that never condenses, so the history only grows and echo N counts every turn.
        proc = _spawn_core(state, "--context-size", "100000000")
        ids = {}

        def reader(proc=proc):
            while (m := _read_frame(proc)) is not None:
                if m.get("ok"):
                    r = m["result"]
                    acked[r["thread_id"]] = max(acked[r["thread_id"]], r["turns"])

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        try:
            for i in range(60):
                tid = threads[i % 3]
                ids[i + 1] = tid
                proc.stdin.write(protocol.encode(protocol.Respond(id=i + 1, prompt=f"{trial}-{i} {big}", thread_id=tid)))
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        time.sleep(rng.uniform(0.0, 0.08))  # kept: a kill at a random moment of the writes is the thing tested
        proc.kill()
        proc.wait()
        t.join(5)
        files = stored(state)
        for tid in threads:
            if tid not in files:
                assert acked[tid] == 0
                continue
            turns = len(files[tid]["history"])
            # The reply is sent after the write: a file may be one turn ahead of what was seen, never behind.
            assert turns in (acked[tid], acked[tid] + 1), (trial, tid, turns, acked[tid])
            responses = [h["response"] for h in files[tid]["history"]]
            assert [int(r.split(":")[0][5:]) for r in responses] == list(range(1, turns + 1))
            acked[tid] = turns
    assert min(acked.values()) > 0  # the trials did store turns, in every thread
    # The next core on the directory reads every thread as this test did and goes on from there.
    last = _spawn_core(state, "--context-size", "100000000")
    files = stored(state)
    for i, tid in enumerate(threads):
        last.stdin.write(protocol.encode(protocol.Respond(id=i + 1, prompt="after", thread_id=tid)))
        last.stdin.flush()
        r = _read_frame(last)["result"]
        assert r["turns"] == len(files[tid]["history"]) + 1, (tid, r["turns"])
    last.kill()
    last.wait()
    print(f"kill -9 during writes: {trials} trials, {sum(acked.values())} turns stored, every thread old or new")


async def test_two_servers_on_one_state_dir_lose_no_turn(tmp_path):
    state = tmp_path / "state"
    per_server = int(os.environ.get("WISP_HAMMER_CALLS", "25"))
    busy = 0
    async with wisp("--state-dir", str(state)) as one, wisp("--state-dir", str(state)) as two:
        seen: list[int] = []

        async def hammer(c, own: str):
            nonlocal busy
            for i in range(per_server):
                while (r := await c.call_tool("respond", {"prompt": f"{own} {i}", "thread_id": "shared"})).is_error:
                    assert error_text(r).startswith("busy"), error_text(r)  # the other process held it past the wait
                    busy += 1
                seen.append(echo_n(ok(r)))
                await say(c, own, f"{own} {i}")

        await asyncio.gather(hammer(one, "own-1"), hammer(two, "own-2"))
        # Every call on the shared thread saw every turn before it: no two saw the same count.
        assert sorted(seen) == list(range(1, 2 * per_server + 1))
        last = await say(one, "shared", "count")
        assert echo_n(last) == 2 * per_server + 1
        assert echo_n(await say(two, "own-1", "count")) == per_server + 1
    files = stored(state)
    assert len(files["shared"]["history"]) == 2 * per_server + 1
    print(f"two servers on one state dir: {2 * per_server} turns on one thread, none lost or doubled, {busy} busy retries")


def _bad_files(state: Path):
    f = state / "thread-bad.json"
    return {
        "garbage": lambda: f.write_bytes(os.urandom(300)),
        "truncated": lambda: f.write_bytes(b'{"format":1,"id":"bad","turns":1}\n{"instructions":null,"tools":[],"roots":[],"history":[{"pro'),
        "version 999": lambda: f.write_bytes(b'{"format":999,"id":"bad","turns":0}\n{}\n'),
        "another id": lambda: f.write_bytes(b'{"format":1,"id":"other","turns":0}\n{"instructions":null,"tools":[],"roots":[],"history":[]}\n'),
        "a bad record with more after it": lambda: f.write_bytes(
            b'{"format":2,"id":"bad","tools":[],"roots":[]}\n{"prompt":\n{"turns":1,"written":1}\n'
            + b'{"prompt":"p","toolExchanges":[],"response":"r","tokens":1}\n{"turns":2,"written":2}\n'),
        "a commit that miscounts": lambda: f.write_bytes(
            b'{"format":2,"id":"bad","tools":[],"roots":[]}\n{"prompt":"p","toolExchanges":[],"response":"r","tokens":1}\n{"turns":2,"written":2}\n'),
        "oversized": lambda: os.truncate(f, 64 * 1024 * 1024 + 1) if f.touch() is None else None,
        "a directory": lambda: f.mkdir(),
        "a symlink": lambda: f.symlink_to(state / "thread-good.json"),
    }


async def test_an_earlier_wisps_bad_thread_file_is_set_aside_at_import_and_affects_only_its_thread(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    for i, (name, make) in enumerate(_bad_files(state).items()):
        write_thread_file(state, f"good{i}", 2)
        make()
        async with wisp("--state-dir", str(state)) as c:
            again = await say(c, "bad", "hi")
            assert (again["created"], echo_n(again)) == (True, 1), name
            assert echo_n(await say(c, f"good{i}", name)) == 3, name
            ok(await c.call_tool("close_thread", {"thread_id": "bad"}))
        assert not (state / "thread-bad.json").exists() and not (state / "thread-bad.json").is_symlink(), name
    aside = [f for f in state.iterdir() if ".corrupt-" in f.name]
    assert len(aside) == len(_bad_files(state)), "each bad file was kept aside for a person to look at"


async def test_a_stored_thread_that_does_not_read_affects_only_its_thread(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state)) as c:
        await say(c, "good", "one")
        await say(c, "bad", "one")
        db = sqlite3.connect(state / "threads.db")
        with db:
            db.execute("UPDATE turns SET tool_exchanges = '[{\"name\":' WHERE thread_id = 'bad'")
        db.close()
        await c.call_tool("list_threads", {})
    async with wisp("--state-dir", str(state)) as c:
        failed = error_text(await c.call_tool("respond", {"prompt": "hi", "thread_id": "bad"}))
        assert "stored thread 'bad' could not be read" in failed and "moved aside" in failed, failed
        again = await say(c, "bad", "hi")
        assert (again["created"], echo_n(again)) == (True, 1)
        assert echo_n(await say(c, "good", "two")) == 2
    db = sqlite3.connect(state / "threads.db")
    assert [r[0].endswith(":bad") for r in db.execute("SELECT id FROM threads WHERE id LIKE '!corrupt-%'")] == [True]
    db.close()


async def test_earlier_wisps_thread_files_are_imported_once_and_kept(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    # Format 2 with a record cut short (its writer killed mid-append), and format 1.
    write_thread_file(state, "t", 3)
    f = state / "thread-t.json"
    f.write_bytes(f.read_bytes() + b'{"prompt":"lost","toolExchanges":[],"resp')
    (state / "thread-old.json").write_bytes(
        b'{"format":1,"id":"old","turns":2,"written":1.5}\n{"instructions":"be brief","tools":[],"roots":[],"history":['
        + b'{"prompt":"a","toolExchanges":[],"response":"echo 1: a","tokens":3},{"prompt":"b","toolExchanges":[],"response":"echo 2: b","tokens":3}]}\n')
    files = {p.name: p.read_bytes() for p in state.iterdir()}
    async with wisp("--state-dir", str(state)) as c:
        listed = ok(await c.call_tool("list_threads", {}))["threads"]
        assert {(t["thread_id"], t["turns"]) for t in listed} == {("t", 3), ("old", 2)}
        r = await say(c, "t", "after")
        assert (r["created"], echo_n(r), r["turns"]) == (False, 4, 4)
        r = await say(c, "old", "after")
        assert (r["created"], echo_n(r), r["turns"]) == (False, 3, 3)
        assert "be brief" in error_text(await c.call_tool("respond", {"prompt": "x", "thread_id": "old", "instructions": "other"}))
        ok(await c.call_tool("close_thread", {"thread_id": "t"}))
    # The files are kept as they were; a closed thread does not come back from its file.
    assert {p.name: p.read_bytes() for p in state.iterdir() if p.name in files} == files
    async with wisp("--state-dir", str(state)) as c:
        assert (await say(c, "t", "anew"))["created"]
        assert echo_n(await say(c, "old", "again")) == 4
    assert stored(state)["old"]["instructions"] == "be brief"


async def test_a_stored_turn_whose_token_count_is_out_of_range_is_counted_again(tmp_path):
    """A stored `tokens` of 2^63-1 (a file of an earlier wisp, or a row) must not trap the core
    when the context is summed: the turn's tokens are estimated again."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    write_thread_file(state, "poison", 2, tokens=2**63 - 1)
    async with wisp("--state-dir", str(state)) as c:
        r = await say(c, "poison", "after")
        assert (r["created"], echo_n(r)) == (False, 3), r
        await say(c, "row", "one")
    db = sqlite3.connect(state / "threads.db")
    with db:
        db.execute("UPDATE turns SET tokens = ? WHERE thread_id = 'row'", (2**63 - 1,))
    db.close()
    async with wisp("--state-dir", str(state)) as c:
        r = await say(c, "row", "after")
        assert (r["created"], echo_n(r)) == (False, 2), r
        assert echo_n(await say(c, "poison", "again")) == 4


async def test_a_damaged_database_or_a_newer_wisps_is_moved_aside_and_threads_are_served_in_memory(tmp_path):
    for kind in ("damaged", "newer"):
        state = tmp_path / kind
        async with wisp("--state-dir", str(state)) as c:
            await say(c, "t", "one")
        db = state / "threads.db"
        if kind == "damaged":
            for extra in ("threads.db-wal", "threads.db-shm"):
                (state / extra).unlink(missing_ok=True)
            db.write_bytes(b"SQLite format 3\x00" + os.urandom(8000))
        else:
            con = sqlite3.connect(db)
            con.execute("PRAGMA user_version = 99")
            con.close()
        async with wisp("--state-dir", str(state)) as c:
            r = await say(c, "t", "two")
            assert (r["created"], echo_n(r)) == (True, 1), (kind, r)
            listed = text_of(await c.call_tool("list_threads", {}))
            assert "moved aside" in listed and "not stored" in listed, (kind, listed)
        assert not db.exists() and [f for f in state.iterdir() if f.name.startswith("threads.db.")], kind


async def test_a_state_dir_swapped_for_a_symlink_is_not_followed(tmp_path):
    """The state dir moved away at run time and a symlink to a shared, world-writable directory
    put in its place, holding a planted thread (in the file format of earlier wisps and in a
    database): nothing planted is read as the caller's thread, nothing is written there, the
    caller is told, and the threads wisp holds go on."""
    state, shared = tmp_path / "state", tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    async with wisp("--state-dir", str(state)) as c:
        await say(c, "mine", "one")
        state.rename(tmp_path / "moved")
        state.symlink_to(shared)
        write_thread_file(shared, "t", 1)
        planted = sqlite3.connect(shared / "threads.db")
        planted.execute("CREATE TABLE planted(x)")
        planted.close()
        before = {p.name: p.read_bytes() for p in shared.iterdir()}
        r = await say(c, "t", "hello")
        assert (r["created"], r["text"]) == (True, "echo 1: hello"), r
        assert "state dir" in r.get("store_error", ""), r
        assert echo_n(await say(c, "mine", "two")) == 2
        assert {p.name: p.read_bytes() for p in shared.iterdir()} == before
        listed = text_of(await c.call_tool("list_threads", {}))
        assert "symbolic link" in listed, listed


async def test_eviction_keeps_the_file_close_and_the_cap_delete_it(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state), "--max-threads", "1", "--max-stored-threads", "3") as c:
        await say(c, "a", "1")
        await say(c, "b", "1")  # evicts a from memory
        r = await say(c, "a", "2")
        assert (r["created"], echo_n(r)) == (False, 2)
        closed = ok(await c.call_tool("close_thread", {"thread_id": "b"}))
        assert closed["closed"] and "b" not in stored(state)
        assert (await say(c, "b", "new"))["created"]
        for tid in ("c", "d"):
            await say(c, tid, "1")
        # Four stored, three kept: a, written last before b's new start, goes.
        assert sorted(stored(state)) == ["b", "c", "d"]
        listed = ok(await c.call_tool("list_threads", {}))
        assert [t["thread_id"] for t in listed["threads"]][0] == "d"
        assert listed["state_dir"] == str(state)


async def test_closing_a_stored_thread_that_is_not_live(tmp_path):
    state = tmp_path / "state"
    async with wisp("--state-dir", str(state)) as c:
        await say(c, "keep", "1")
    async with wisp("--state-dir", str(state)) as c:
        assert ok(await c.call_tool("close_thread", {"thread_id": "keep"}))["closed"]
        assert (await say(c, "keep", "again"))["created"]


async def test_an_unusable_state_dir_serves_in_memory_and_says_so(tmp_path):
    state = tmp_path / "open"
    state.mkdir()
    state.chmod(0o777)
    async with wisp("--state-dir", str(state)) as c:
        r = await say(c, "m", "1")
        assert r["created"]
        listed = text_of(await c.call_tool("list_threads", {}))
        assert "not stored" in listed and "chmod 700" in listed, listed
        assert not list(state.iterdir())
        # Not durable, so a crash loses the thread, and the caller is told.
        os.kill(core_pids(c)[-1], signal.SIGKILL)
        await wait_for(lambda: len(core_pids(c)) == 2, 10)
        assert error_text(await c.call_tool("respond", {"prompt": "2", "thread_id": "m"})).startswith("thread_lost")


async def test_without_a_state_dir_nothing_is_written(tmp_path):
    """The default: the shim and core are run from an empty directory with an empty HOME and TMPDIR."""
    from mcp import Client, StdioServerParameters, stdio_client

    from harness import shim_command

    cwd, home, tmp = tmp_path / "cwd", tmp_path / "home", tmp_path / "tmp"
    for d in (cwd, home, tmp):
        d.mkdir()
    argv = shim_command("--backend", "echo")
    env = shim_env(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(REPO / "python"))
    async with Client(stdio_client(StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(cwd)))) as c:
        await say(c, "t", "1")
        assert echo_n(await say(c, "t", "2")) == 2
        await c.call_tool("close_thread", {"thread_id": "t"})
    assert [list(d.rglob("*")) for d in (cwd, home, tmp)] == [[], [], []]
