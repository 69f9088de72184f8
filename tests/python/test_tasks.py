"""`respond` as an MCP task (README "Tasks"), by raw JSON-RPC in both generations that define
tasks: 2025-11-25 (the experimental `tasks` capability; `task` on the call) and 2026-07-28 (the
`io.modelcontextprotocol/tasks` extension; the server decides), over stdio and `--http`.

The `mcp` SDK's client (2.3.0) has no task runtime: it declares no task support, so every test
that drives it elsewhere is the check that such a client sees what it always saw; here a raw
client that does not declare tasks is compared with one that does.

Order and overlap are shown by barriers (a call's place in its thread: list_threads' `pending`,
and echo's N), never by clocks; the one time checked is the ttl the README promises."""

from __future__ import annotations

import json
import subprocess
import time

import anyio
import httpx2
import pytest

from harness import REPO, held_args, release_args, released, shim_command, shim_env, wait_until
from openai_stub import OpenAIStub
from harness.http import MODERN_HEADERS, http_wisp, legacy_session
from harness.tasks import EXT, GENERATIONS, LEGACY, MODERN, RELATED, call, envelope, handle_of, legacy, make_task

def plain(result: dict, thread_id: str, other: str) -> dict:
    """A tool result as the plain call's would read, with `other` thread id in place of `thread_id`,
    and without the envelope's `_meta` (serverInfo, related-task)."""
    text = json.dumps({k: v for k, v in result.items() if k != "_meta"})
    return json.loads(text.replace(thread_id, other))


# --- a task is the call -----------------------------------------------------------------------


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_task_runs_is_polled_and_its_result_is_the_plain_calls(raw_clients, generation):
    c = raw_clients(generation)
    # The same two calls on two threads: plainly on one, the second as a task on the other.
    # make_task's first call, as it is on the task's thread (its key the same length, for the same usage).
    first = c.respond("!hold before-plain-1 before second", "plain-1", task=False)
    c.held("before-plain-1")
    assert c.release("before-plain-1") == 1
    c.wait(first)
    expected = c.request("tools/call", {"name": "respond", "arguments": {"prompt": "second", "thread_id": "plain-1"}})
    task_id = make_task(c, "second", "tasks-1")
    polled = c.request("tasks/get", {"taskId": task_id})["result"]
    assert polled["taskId"] == task_id and polled["status"] in ("working", "completed")
    got = c.outcome(task_id)
    assert got["status"] == "completed"
    assert plain(got["result"], "tasks-1", "plain-1") == plain(expected["result"], "plain-1", "plain-1")
    assert got["result"]["structuredContent"]["text"] == "echo 2: second"
    if generation == LEGACY:
        assert got["result"]["_meta"][RELATED] == {"taskId": task_id}


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_failed_call_is_the_tasks_result_too(raw_clients, generation):
    c = raw_clients(generation)
    expected = c.request("tools/call", call("respond", prompt="!fail generation_failed", thread_id="plain-1"))
    assert expected["result"]["isError"] is True
    task_id = make_task(c, "!fail generation_failed", "tasks-1")
    got = c.outcome(task_id)
    # 2025-11-25: a tool error fails the task; 2026-07-28: the task completes with the tool error.
    assert got["status"] == ("failed" if generation == LEGACY else "completed")
    assert plain(got["result"], "tasks-1", "plain-1") == plain(expected["result"], "plain-1", "plain-1")


def test_a_task_refused_by_its_arguments_is_answered_as_the_plain_call_would_be(raw_clients):
    legacy, modern = raw_clients(LEGACY), raw_clients(MODERN)
    bad = {"name": "respond", "arguments": {"prompt": 5}}
    expected = legacy.request("tools/call", bad)["result"]
    assert expected["isError"] is True
    task_id = handle_of(legacy.request("tools/call", {**bad, "task": {}}), LEGACY)
    assert legacy.outcome(task_id)["result"] == {**expected, "_meta": {RELATED: {"taskId": task_id}}}
    # 2026-07-28: nothing to wait for, so no task: the error at once.
    answered = modern.request("tools/call", bad)["result"]
    assert answered.get("resultType") == "complete" and answered["isError"] is True


def test_progress_goes_on_with_the_calls_token_tagged_with_the_task(raw_clients):
    c = raw_clients(LEGACY)
    # Kept: echo spreads its partials over the sleep, which is what makes progress here.
    task_id = handle_of(c.wait(c.respond("!sleep 300 tell me", "t", progress="tok")), LEGACY)
    assert c.outcome(task_id)["status"] == "completed"
    seen = [n["params"] for n in c.notes if n.get("method") == "notifications/progress"]
    assert seen and all(p["progressToken"] == "tok" and p["_meta"][RELATED] == {"taskId": task_id} for p in seen)
    values = [p["progress"] for p in seen]
    assert values == sorted(set(values))


def test_a_2026_task_shows_its_partial_text_as_its_status_message(raw_clients):
    c = raw_clients(MODERN)
    task_id = make_task(c, "words to watch", "t")
    assert c.outcome(task_id)["statusMessage"] != ""
    # Plain calls from a client that declared the extension, on an idle thread with echo: no task.
    answered = c.request("tools/call", call("respond", prompt="quick", thread_id="idle"))["result"]
    assert answered["resultType"] == "complete" and answered["structuredContent"]["text"] == "echo 1: quick"


def test_with_a_model_every_2026_call_from_a_declaring_client_is_a_task(raw_clients):
    with OpenAIStub() as stub:
        model = ("--backend", "openai", "--endpoint", stub.endpoint)
        c = raw_clients(MODERN, True, *model)
        task_id = handle_of(c.wait(c.respond("hello", "idle")), MODERN)
        got = c.outcome(task_id)
        assert got["status"] == "completed" and got["result"]["structuredContent"]["text"] == "reply 1: hello"
        other = raw_clients(MODERN, False, *model)
        answered = other.wait(other.respond("hello", "idle-2"))["result"]
        assert answered["resultType"] == "complete" and answered["structuredContent"]["text"] == "reply 1: hello"


def test_a_2026_call_with_no_core_to_run_it_is_the_plain_calls_tool_error(raw_clients, tmp_path):
    c = raw_clients(MODERN, True, "--core", str(tmp_path / "no-such-core"))
    answered = c.wait(c.respond("hello", "t"))["result"]
    assert answered["resultType"] == "complete" and answered["content"][0]["text"].startswith("core_missing:")


# --- the thread rules ---------------------------------------------------------------------------


def test_tasks_and_plain_calls_on_one_thread_run_in_order(raw_clients):
    c = raw_clients(LEGACY)
    first = handle_of(c.wait(c.respond("!hold a a", "t")), LEGACY)
    c.held("a")
    b = c.respond("b", "t", task=False)
    c.until_pending("t", 2)  # b is queued behind the task
    third = handle_of(c.wait(c.respond("c", "t")), LEGACY)
    d = c.respond("d", "t", task=False)
    c.until_pending("t", 4)
    assert c.release("a") == 1
    assert c.wait(b)["result"]["structuredContent"]["text"] == "echo 2: b"
    assert c.wait(d)["result"]["structuredContent"]["text"] == "echo 4: d"
    assert c.outcome(first)["result"]["structuredContent"]["text"] == "echo 1: !hold a a"
    assert c.outcome(third)["result"]["structuredContent"]["text"] == "echo 3: c"


@pytest.mark.parametrize("generation", GENERATIONS)
def test_cancel_mid_run_leaves_the_thread_as_it_was(raw_clients, generation):
    c = raw_clients(generation)
    c.request("tools/call", {"name": "respond", "arguments": {"prompt": "one", "thread_id": "t"}})
    task_id = make_task(c, "!hold never kept", "t")
    c.held("never")  # the task's call is the one running
    answer = c.request("tasks/cancel", {"taskId": task_id})
    if generation == LEGACY:
        assert answer["result"]["status"] == "cancelled"
        assert c.request("tasks/result", {"taskId": task_id})["error"]["data"] == {RELATED: {"taskId": task_id}}
    else:
        assert set(answer["result"]) <= {"resultType", "_meta"} and answer["result"]["resultType"] == "complete"
    assert c.request("tasks/get", {"taskId": task_id})["result"]["status"] == "cancelled"
    after = c.request("tools/call", {"name": "respond", "arguments": {"prompt": "after", "thread_id": "t"}})
    assert after["result"]["structuredContent"]["text"] == "echo 3: after"  # one, make_task's first, after


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_cancel_after_the_task_completed_changes_nothing(raw_clients, generation):
    c = raw_clients(generation)
    task_id = make_task(c, "kept", "t")
    assert c.outcome(task_id)["status"] == "completed"
    answer = c.request("tasks/cancel", {"taskId": task_id})
    if generation == LEGACY:
        assert answer["error"]["code"] == -32602 and "completed" in answer["error"]["message"]
    else:
        assert "error" not in answer
    assert c.request("tasks/get", {"taskId": task_id})["result"]["status"] == "completed"
    after = c.request("tools/call", {"name": "respond", "arguments": {"prompt": "next", "thread_id": "t"}})
    assert after["result"]["structuredContent"]["text"] == "echo 3: next"


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_core_crash_fails_the_running_task_with_the_lost_thread_wording(raw_clients, generation):
    c = raw_clients(generation)
    task_id = make_task(c, "!hold never doomed", "doomed")
    c.held("never")
    crash = c.request("tools/call", {"name": "respond", "arguments": {"prompt": "!crash", "thread_id": "other"}})
    assert crash["result"]["content"][0]["text"].startswith("core_crashed:")
    got = c.outcome(task_id)
    assert got["status"] == ("failed" if generation == LEGACY else "completed")
    text = got["result"]["content"][0]["text"]
    assert got["result"]["isError"] is True and text.startswith("core_crashed:")
    assert "Thread 'doomed''s history was lost" in text


# --- lifetime and bounds ------------------------------------------------------------------------


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_task_is_freed_when_its_ttl_passes(raw_clients, generation):
    # 2025-11-25 asks for 60 s: wisp's maximum (WISP_TASK_TTL) bounds it; 2026-07-28 gets the maximum.
    c = raw_clients(generation, env={"WISP_TASK_TTL": "2"})
    started = time.monotonic()
    task_id = make_task(c, "short-lived", "t")
    assert c.request("tasks/get", {"taskId": task_id})["result"]["ttl" if generation == LEGACY else "ttlMs"] == 2000
    assert c.outcome(task_id)["status"] == "completed"
    got: dict = {}

    def expired() -> bool:
        got.clear()
        got.update(c.request("tasks/get", {"taskId": task_id}))
        return "error" in got

    assert wait_until(expired, 10), "the task outlived its ttl"
    assert time.monotonic() - started >= 2.0  # never before its ttl
    assert got["error"]["code"] == -32602 and "expired" in got["error"]["message"]


def test_a_task_running_when_its_ttl_passes_is_cancelled_and_its_turn_not_kept(raw_clients):
    c = raw_clients(LEGACY, env={"WISP_TASK_TTL": "2"})  # room for the rendezvous below, on a loaded machine
    c.wait(c.respond("!hold never forgotten", "t"))
    c.held("never")
    c.until_pending("t", 0)  # its ttl passed: cancelled, though never released
    after = c.request("tools/call", {"name": "respond", "arguments": {"prompt": "after", "thread_id": "t"}})
    assert after["result"]["structuredContent"]["text"] == "echo 1: after"


def test_a_client_holds_at_most_its_bound_of_tasks(raw_clients):
    c = raw_clients(LEGACY, env={"WISP_MAX_TASKS": "2"})
    held = [handle_of(c.wait(c.respond(f"!hold bound {i}", f"t{i}")), LEGACY) for i in range(2)]
    c.held("bound", calls=2)
    refused = c.wait(c.respond("one too many", "t3"))
    assert refused["error"]["code"] == -32000 and "WISP_MAX_TASKS" in refused["error"]["message"]
    listing = c.request("tools/call", call("list_threads"))["result"]["structuredContent"]
    assert "t3" not in [t["thread_id"] for t in listing["threads"]]
    assert c.release("bound") == 2
    assert [c.outcome(t)["status"] for t in held] == ["completed", "completed"]
    # A plain call is not a task: not bounded by it.
    assert "result" in c.request("tools/call", {"name": "respond", "arguments": {"prompt": "plain", "thread_id": "t3"}})


def test_another_process_cannot_see_a_task_and_a_lost_id_answers_at_once(raw_clients):
    a, b = raw_clients(LEGACY), raw_clients(LEGACY)
    task_id = handle_of(a.wait(a.respond("mine", "t")), LEGACY)
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        assert b.request(method, {"taskId": task_id})["error"]["code"] == -32602
    assert b.request("tasks/list")["result"]["tasks"] == []
    assert [t["taskId"] for t in a.request("tasks/list")["result"]["tasks"]] == [task_id]


# --- a client that did not declare tasks sees what it always saw --------------------------------


def test_a_handshake_client_without_tasks_sees_todays_server(raw_clients):
    without, with_ = raw_clients(LEGACY, declare=False), raw_clients(LEGACY)
    plain_init, task_init = without.initialized["result"], with_.initialized["result"]
    assert "tasks" not in plain_init["capabilities"]
    added = {**plain_init["capabilities"], "tasks": task_init["capabilities"]["tasks"]}
    assert {**plain_init, "capabilities": added} == task_init
    plain_tools, task_tools = (x.request("tools/list")["result"]["tools"] for x in (without, with_))
    assert all("execution" not in t for t in plain_tools)
    assert [{k: v for k, v in t.items() if k != "execution"} for t in task_tools] == plain_tools
    assert [t.get("execution") for t in task_tools] == [{"taskSupport": "optional"}, None, None, None]
    # Its `task` is ignored: the call is answered plainly; tasks/* are unknown methods to it.
    answered = without.wait(without.respond("hello", "t"))["result"]
    assert answered["structuredContent"]["text"] == "echo 1: hello"
    assert without.request("tasks/get", {"taskId": "x"})["error"]["code"] == -32601
    # The other tools do not run as tasks ("forbidden"): asking for one is -32601, as the spec says.
    refused = with_.request("tools/call", {**call("list_threads"), "task": {}})
    assert refused["error"]["code"] == -32601 and "without `task`" in refused["error"]["message"]
    assert "result" in without.request("tools/call", {**call("list_threads"), "task": {}})  # ignored, as today
    # A client that declared tasks but calls without `task` is answered plainly too.
    assert with_.wait(with_.respond("plain", "u", task=False))["result"]["structuredContent"]["text"] == "echo 1: plain"


def test_a_2026_client_without_the_extension_gets_plain_answers_and_32021(raw_clients):
    c = raw_clients(MODERN, declare=False)
    slow = c.respond("!hold first first", "t", task=False)
    c.held("first")
    second = c.respond("second", "t")  # it cannot start at once, but no task for this client
    c.until_pending("t", 2)
    assert c.release("first") == 1
    queued = c.wait(second)["result"]
    assert queued["resultType"] == "complete" and queued["structuredContent"]["text"] == "echo 2: second"
    assert c.wait(slow)["result"]["structuredContent"]["text"] == "echo 1: !hold first first"
    assert c.request("tasks/get", {"taskId": "x"})["error"]["code"] == -32021
    # server/discover advertises the extension to every client, and never the legacy capability.
    caps = c.request("server/discover")["result"]["capabilities"]
    assert caps["extensions"] == {EXT: {}} and "tasks" not in caps
    assert c.request("tasks/result", {"taskId": "x"})["error"]["code"] == -32601


# --- over HTTP ----------------------------------------------------------------------------------


async def _rpc(hc: httpx2.AsyncClient, url: str, body: dict, headers: dict) -> dict:
    """One JSON-RPC request over streamable HTTP: its reply, from JSON or from the SSE stream."""
    r = await hc.post(url, json=body, headers=headers)
    # A 2026-07-28 error comes with an HTTP status of its own (400 for -32602).
    assert r.status_code == 200 or (r.status_code < 500 and "error" in r.json()), r.text
    if r.headers.get("content-type", "").startswith("application/json"):
        return r.json()
    for line in r.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            msg = json.loads(line[5:])
            if msg.get("id") == body["id"]:
                return msg
    raise AssertionError(f"no reply in {r.text[:500]!r}")


def _modern(method: str, params: dict, rid: int, declare: bool = True) -> tuple[dict, dict]:
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": envelope(declare)}}
    name = params.get("taskId", params.get("name", ""))
    return body, {**MODERN_HEADERS, "Mcp-Method": method, "Mcp-Name": name}


async def _modern_tool(hc: httpx2.AsyncClient, server, arguments: dict, rid: int) -> dict:
    """A plain 2026-07-28 respond call (the client declares no tasks): its structured result."""
    body, headers = _modern("tools/call", call("respond", **arguments), rid, declare=False)
    answer = await _rpc(hc, server.url, body, server.headers(**headers))
    assert not answer["result"].get("isError"), answer
    return answer["result"]["structuredContent"]


async def test_http_tasks_in_both_generations_scoped_to_their_client():
    async with http_wisp() as server:
        async with httpx2.AsyncClient(timeout=60) as hc:
            a = await legacy_session(hc, server, {"tasks": {}})
            b = await legacy_session(hc, server, {"tasks": {}})
            params = {**call("respond", prompt="!hold h over http", thread_id="h"), "task": {"ttl": 60000}}
            task_id = handle_of(await _rpc(hc, server.url, legacy(2, "tools/call", params), a), LEGACY)
            await _modern_tool(hc, server, held_args("h"), 4)  # working, till released
            # Another session (same token) cannot see or cancel it.
            for rid, method in enumerate(("tasks/get", "tasks/cancel", "tasks/result"), 10):
                got = await _rpc(hc, server.url, legacy(rid, method, {"taskId": task_id}), b)
                assert got["error"]["code"] == -32602
            assert released((await _modern_tool(hc, server, release_args("h"), 5))["text"]) == 1
            got = await _rpc(hc, server.url, legacy(3, "tasks/result", {"taskId": task_id}), a)
            assert got["result"]["structuredContent"]["text"] == "echo 1: !hold h over http"
            # 2026-07-28 over HTTP: a call behind another on its thread becomes a task; its id rides Mcp-Name.
            async with anyio.create_task_group() as tg:
                body, headers = _modern("tools/call", call("respond", prompt="!hold m slow", thread_id="m"), 20)
                tg.start_soon(_rpc, hc, server.url, body, server.headers(**headers))
                await _modern_tool(hc, server, held_args("m"), 21)
                body, headers = _modern("tools/call", call("respond", prompt="behind", thread_id="m"), 22)
                modern_id = handle_of(await _rpc(hc, server.url, body, server.headers(**headers)), MODERN)
                assert released((await _modern_tool(hc, server, release_args("m"), 27))["text"]) == 1
            # A handshake session does not see a 2026-07-28 task (no session there), nor the reverse.
            got = await _rpc(hc, server.url, legacy(23, "tasks/get", {"taskId": modern_id}), a)
            assert got["error"]["code"] == -32602
            body, headers = _modern("tasks/get", {"taskId": task_id}, 24)
            assert (await _rpc(hc, server.url, body, server.headers(**headers)))["error"]["code"] == -32602
        # The client that made it went away; polling with its token from a new connection finds it.
        async with httpx2.AsyncClient(timeout=60) as hc:
            deadline = time.monotonic() + 20
            while True:
                body, headers = _modern("tasks/get", {"taskId": modern_id}, 25)
                got = (await _rpc(hc, server.url, body, server.headers(**headers)))["result"]
                if got["status"] == "completed":
                    break
                assert time.monotonic() < deadline
                await anyio.sleep(0.05)  # the poll's interval
            assert got["result"]["structuredContent"]["text"] == "echo 2: behind"
            body, headers = _modern("tasks/get", {"taskId": modern_id}, 26)
            mismatch = await _rpc(hc, server.url, body, server.headers(**{**headers, "Mcp-Name": "another-id"}))
            assert mismatch["error"]["code"] == -32020


@pytest.mark.parametrize("name, value", [
    ("WISP_TASK_TTL", "0.5"), ("WISP_TASK_TTL", "soon"), ("WISP_MAX_TASKS", "257"),
])
def test_a_task_bound_out_of_range_is_refused_at_start(name, value):
    done = subprocess.run(shim_command("--backend", "echo"), stdin=subprocess.DEVNULL, capture_output=True,
                          env=shim_env(**{name: value}), cwd=REPO, timeout=60)
    assert done.returncode != 0 and name in done.stderr.decode() and done.stdout == b""
