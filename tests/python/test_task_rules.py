"""Tasks keep the thread rules (docs/threads.md), by raw JSON-RPC over stdio with echo: calls on
one thread run in arrival order whatever their shape; a core killed under a running or queued task
fails it `core_crashed` and the next call on its thread gets `thread_lost`, never a quietly new
thread; and a task cancelled as it completes ends in the one state its thread shows.

Order is read back from the thread itself (read_thread's prompts and echo's N); a call's place is
waited for by list_threads' `pending`, never by a clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psutil
import pytest

from harness import INITIALIZED, REPO, call as tool_call, children, close_shim, jsonrpc, shim_command, shim_env, wait_until
from harness.tasks import GENERATIONS, LEGACY, MODERN, call, handle_of


def prompts(c, thread_id: str) -> list[str]:
    read = c.request("tools/call", call("read_thread", thread_id=thread_id))["result"]["structuredContent"]
    return [t["prompt"] for t in read["items"]]


def core_of(c) -> int:
    """The shim's running wisp-core (its child), found as the other tests find it: by process."""
    cores: list[int] = []

    def found() -> bool:
        cores[:] = [p for p in children(c.proc.pid) if psutil.Process(p).name().startswith("wisp-core")]
        return bool(cores)

    assert wait_until(found, 10), "no wisp-core under the shim"
    return cores[-1]


def first_call(c, prompt: str, thread_id: str) -> None:
    """A first call on the thread held by echo (`prompt` is `!hold KEY …`) until the test
    releases it, as a task where the generation lets the client ask for one (2026-07-28 with
    echo makes a task only of a call that cannot start at once); returns once it is parked."""
    rid = c.respond(prompt, thread_id, task=c.generation == LEGACY)
    if c.generation == LEGACY:
        handle_of(c.wait(rid), LEGACY)
    c.held(prompt.split()[1])


def plain(c, prompt: str, thread_id: str) -> int:
    """A call that is not a task: 2026-07-28 lets only the server decide, so its request does not
    declare the extension."""
    declare, c.declare = c.declare, False
    try:
        return c.respond(prompt, thread_id, task=False)
    finally:
        c.declare = declare


def together(c, make):
    """The requests `make` sends, written to wisp's stdin in one write: they arrive at once."""
    lines: list[bytes] = []
    c.send = lines.append  # the instance's own, for a moment
    try:
        rids = make()
    finally:
        del c.send
    c.send(b"".join(lines))
    return rids


# --- arrival order -------------------------------------------------------------------------------


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("pipelined", [False, True], ids=["each-handle-awaited", "sent-together"])
def test_a_plain_call_after_two_tasks_on_one_thread_runs_after_them(raw_clients, generation, pipelined):
    c = raw_clients(generation)
    first_call(c, "!hold one one", "t")  # still running when the others arrive
    if pipelined:
        # Written in one go: wisp reads them in this order, and that is their order on the thread.
        rids = together(c, lambda: [c.respond("two", "t"), c.respond("three", "t"), plain(c, "four", "t")])
        two, three = (handle_of(c.wait(r), generation) for r in rids[:2])
        four = rids[2]
    else:
        two = handle_of(c.wait(c.respond("two", "t")), generation)
        three = handle_of(c.wait(c.respond("three", "t")), generation)
        four = plain(c, "four", "t")
    c.until_pending("t", 4)
    assert c.release("one") == 1
    assert c.wait(four)["result"]["structuredContent"]["text"] == "echo 4: four"
    assert [c.outcome(t)["result"]["structuredContent"]["text"] for t in (two, three)] == ["echo 2: two",
                                                                                             "echo 3: three"]
    assert prompts(c, "t") == ["!hold one one", "two", "three", "four"]


def test_calls_of_every_shape_sent_together_run_in_arrival_order(raw_clients):
    c = raw_clients(LEGACY)
    first_call(c, "!hold a a", "t")
    shapes = [("b", True), ("c", False), ("d", True), ("e", False), ("f", True)]
    rids = together(c, lambda: [c.respond(p, "t", task=task) for p, task in shapes])
    for rid, (p, task) in zip(rids, shapes):
        if task:
            handle_of(c.wait(rid), LEGACY)
    c.until_pending("t", 6)
    assert c.release("a") == 1
    for rid, (p, task) in zip(rids, shapes):
        if not task:
            assert c.wait(rid)["result"]["structuredContent"]["text"].endswith(f": {p}")
    c.until_pending("t", 0)
    assert prompts(c, "t") == ["!hold a a", "b", "c", "d", "e", "f"]


# --- a core crash under a task ---------------------------------------------------------------


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_core_killed_under_a_running_and_a_queued_task_fails_both_and_the_thread_is_lost(raw_clients,
                                                                                         generation):
    c = raw_clients(generation)
    c.request("tools/call", call("respond", prompt="history", thread_id="t"))
    first_call(c, "!hold never running", "t")
    queued = handle_of(c.wait(c.respond("queued", "t")), generation)
    c.until_pending("t", 2)
    os.kill(core_of(c), signal.SIGKILL)
    for task_id in ([queued] if generation == MODERN else [queued, *[t["taskId"] for t in
                                                                     c.request("tasks/list")["result"]["tasks"]
                                                                     if t["taskId"] != queued]]):
        got = c.outcome(task_id)
        assert got["status"] == ("failed" if generation == LEGACY else "completed")
        text = got["result"]["content"][0]["text"]
        assert got["result"]["isError"] is True and text.startswith("core_crashed:"), text
        assert "thread_lost" in text  # it says what the next call on the thread will hear
    # The next call on the thread is told its history is gone, once; the one after starts anew.
    lost = c.request("tools/call", call("respond", prompt="next", thread_id="t"))["result"]
    assert lost["isError"] is True and lost["content"][0]["text"].startswith("thread_lost:")
    again = c.request("tools/call", call("respond", prompt="again", thread_id="t"))["result"]
    assert again["structuredContent"]["text"] == "echo 1: again" and again["structuredContent"]["created"] is True


def test_a_core_killed_under_a_task_on_a_new_thread_loses_no_history(raw_clients):
    # A call that creates a thread and does not end normally leaves no thread: nothing was lost.
    c = raw_clients(LEGACY)
    task_id = handle_of(c.wait(c.respond("!hold never creating", "new")), LEGACY)
    c.held("never")
    os.kill(core_of(c), signal.SIGKILL)
    assert c.outcome(task_id)["result"]["content"][0]["text"].startswith("core_crashed:")
    again = c.request("tools/call", call("respond", prompt="again", thread_id="new"))["result"]
    assert again["structuredContent"]["text"] == "echo 1: again"


# --- cancelled as it completes -----------------------------------------------------------------


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_task_cancelled_as_it_completes_ends_as_its_thread_shows(raw_clients, generation):
    """Many rounds of a cancel sent as the task's call ends: the call's length follows the race's
    edge (longer after a completion, shorter after a cancel), so that both outcomes come; each
    round's state must match the thread: completed, its turn kept; cancelled, not. 2026-07-28 with
    echo makes a task only of a call behind another: there the call ahead is the one that lasts."""
    c = raw_clients(generation)
    c.request("tools/call", call("respond", prompt="seed", thread_id="t"))
    turns, delay, seen = 1, 5, {"completed": 0, "cancelled": 0}
    for n in range(40 if generation == LEGACY else 25):
        if generation == MODERN:
            # Kept, as below: the call's length on the race's edge is the thing tested.
            plain(c, f"!sleep {delay} ahead", "t")  # its reply is not waited for: the task is behind it
            turns += 1
        prompt = f"round {n}" if generation == MODERN else f"!sleep {delay} round {n}"
        reply = c.wait(c.respond(prompt, "t"))["result"]
        if reply.get("resultType") == "complete":  # the call ahead had ended: answered plainly
            turns += 1
            delay += 3
            continue
        task_id = handle_of({"result": reply}, generation)
        c.request("tasks/cancel", {"taskId": task_id})
        status = c.outcome(task_id)["status"]
        assert status in seen, status
        seen[status] += 1
        turns += status == "completed"
        c.until_pending("t", 0)
        read = c.request("tools/call", call("read_thread", thread_id="t"))["result"]["structuredContent"]
        kept = prompt in [t["prompt"] for t in read["items"]]
        assert (read["turns"], kept) == (turns, status == "completed"), (n, status, read["turns"], turns)
        delay = max(0, delay + (3 if status == "completed" else -2))
    assert seen["completed"] and seen["cancelled"], f"the race was never on its edge: {seen}"


# --- a call that asks the client for its roots ----------------------------------------------


def test_a_call_waiting_for_the_clients_roots_keeps_its_place_on_its_thread():
    # A call that binds tools asks the client for its roots before it can go to the core. A plain
    # call on the same thread sent after it must not overtake it: it would create the thread
    # without tools, and the first call would then be refused for binding tools to a thread that
    # exists. The client holds its roots answer until the second call and a ping barrier are in.
    init = jsonrpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": False}},
                                  "clientInfo": {"name": "wisp-tests", "version": "0"}}, id=1)
    proc = subprocess.Popen(shim_command("--backend", "echo"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=shim_env(), cwd=REPO)

    def send(data: bytes) -> None:
        proc.stdin.write(data)
        proc.stdin.flush()

    def until(rids: set) -> dict:
        got: dict = {}
        while not rids <= got.keys():
            line = proc.stdout.readline()
            assert line, f"the shim closed stdout; answers so far: {got}"
            msg = json.loads(line)
            got[msg.get("id")] = msg
        return got

    try:
        send(init)
        assert "result" in until({1})[1]
        send(INITIALIZED + tool_call("respond", {"prompt": "warm", "thread_id": "w"}, 2))
        assert "result" in until({2})[2]  # the core is up: nothing else delays a call
        send(tool_call("respond", {"prompt": "first", "thread_id": "t", "tools": ["read_file"]}, 3))
        ask = json.loads(proc.stdout.readline())
        assert ask.get("method") == "roots/list", ask
        send(tool_call("respond", {"prompt": "second", "thread_id": "t"}, 4) + jsonrpc("ping", id=5))
        early = until({5})
        send((json.dumps({"jsonrpc": "2.0", "id": ask["id"], "result": {"roots": [{"uri": f"file://{REPO}"}]}})
              + "\n").encode())
        got = {**early, **until({3, 4} - early.keys())}
        first, second = got[3]["result"], got[4]["result"]
        assert not first.get("isError") and first["structuredContent"]["created"], first
        assert not second.get("isError"), second
        assert second["structuredContent"]["text"] == "echo 2: second", second
    finally:
        close_shim(proc, 10)
