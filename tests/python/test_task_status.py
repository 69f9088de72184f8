"""`notifications/tasks/status` (2025-11-25 tasks, "Task Status Notification"): what a client that
declared tasks sees of a task's status over raw JSON-RPC on stdio, for a task that completes, one
that fails and one cancelled; and that no other client sees any.

A respond task changes status once, from `working` (its handle) to how it ended: the client sees
the handle, then one notification carrying the whole task as tasks/get shows it, before any reply
that shows the end (tasks/result, tasks/cancel). The 2026-07-28 extension sends its notifications
only on a `subscriptions/listen` stream the client opened for them, which wisp does not serve: its
clients poll, and get none.

The `mcp` SDK's client (2.3.0) has no task API (no tasks/get, tasks/result or task-augmented
call_tool: `grep -rn tasks .venv/lib/python3.11/site-packages/mcp/client/` finds only asyncio
tasks), so there is no SDK end-to-end task test here; the raw client stands in for it."""

from __future__ import annotations


import pytest

from harness import wait_until
from harness.tasks import LEGACY, MODERN, RELATED, call, handle_of, make_task

STATUS = "notifications/tasks/status"


def statuses(c, task_id: str) -> list[dict]:
    return [n["params"] for n in c.notes if n.get("method") == STATUS and n["params"].get("taskId") == task_id]


def until_notified(c, task_id: str, timeout: float = 20) -> list[dict]:
    assert wait_until(lambda: statuses(c, task_id), timeout), f"no {STATUS} for task {task_id}"
    return statuses(c, task_id)


def ends_as_tasks_get_shows(c, task_id: str, status: str) -> None:
    """The one notification a task sends: its end, as the whole task (tasks/get's fields), with
    no related-task `_meta` (the spec: the id is in the params already)."""
    seen = until_notified(c, task_id)
    got = c.request("tasks/get", {"taskId": task_id})["result"]
    assert [n["status"] for n in seen] == [status]
    assert seen[0] == {k: v for k, v in got.items() if k != "_meta"}
    assert set(seen[0]) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttl", "pollInterval"}
    assert RELATED not in seen[0].get("_meta", {})


def test_a_task_that_completes_is_seen_working_then_completed(raw_clients):
    c = raw_clients(LEGACY)
    rid = c.respond("!hold done done", "t")
    handle = c.wait(rid)
    task_id = handle_of(handle, LEGACY)
    c.held("done")
    assert statuses(c, task_id) == []  # nothing while it works: the handle is its `working`
    assert c.release("done") == 1
    answer = c.request("tasks/result", {"taskId": task_id})
    assert answer["result"]["structuredContent"]["text"] == "echo 1: !hold done done"
    # The notification went out before the reply that shows the end.
    assert [n["status"] for n in statuses(c, task_id)] == ["completed"]
    ends_as_tasks_get_shows(c, task_id, "completed")


def test_a_task_that_fails_is_seen_working_then_failed(raw_clients):
    c = raw_clients(LEGACY)
    task_id = handle_of(c.wait(c.respond("!fail generation_failed", "t")), LEGACY)
    ends_as_tasks_get_shows(c, task_id, "failed")
    assert c.request("tasks/result", {"taskId": task_id})["result"]["isError"] is True
    # Refused by its arguments before it reached a model: failed as well, once.
    refused = handle_of(c.request("tools/call", {**call("respond", prompt=5), "task": {}}), LEGACY)
    ends_as_tasks_get_shows(c, refused, "failed")


def test_a_cancelled_task_is_seen_working_then_cancelled_and_nothing_after(raw_clients):
    c = raw_clients(LEGACY)
    task_id = handle_of(c.wait(c.respond("!hold never kept", "t")), LEGACY)
    c.held("never")
    assert c.request("tasks/cancel", {"taskId": task_id})["result"]["status"] == "cancelled"
    assert [n["status"] for n in statuses(c, task_id)] == ["cancelled"]  # before the cancel's reply
    ends_as_tasks_get_shows(c, task_id, "cancelled")
    # A cancel of the ended task changes nothing, and says nothing more.
    assert c.request("tasks/cancel", {"taskId": task_id})["error"]["code"] == -32602
    c.request("tools/call", call("respond", prompt="after", thread_id="t"))
    assert [n["status"] for n in statuses(c, task_id)] == ["cancelled"]


def test_many_tasks_each_end_once(raw_clients):
    c = raw_clients(LEGACY)
    # Kept: calls of six lengths, so that they end apart; their ends are the thing tested.
    ids = [handle_of(c.wait(c.respond(f"!sleep {50 * i} n{i}", f"t{i}")), LEGACY) for i in range(6)]
    for task_id in ids:
        assert c.outcome(task_id)["status"] == "completed"
        ends_as_tasks_get_shows(c, task_id, "completed")
    assert len([n for n in c.notes if n.get("method") == STATUS]) == len(ids)


@pytest.mark.parametrize("generation, declare", [(LEGACY, False), (MODERN, True), (MODERN, False)])
def test_no_status_notification_to_a_client_that_did_not_ask_for_them(raw_clients, generation, declare):
    c = raw_clients(generation, declare)
    # A plain call on a busy thread, and (for the extension's client) the task wisp makes of one.
    c.respond("!hold first first", "t", task=False)
    c.held("first")
    rid = c.respond("second", "t")
    c.until_pending("t", 2)
    assert c.release("first") == 1
    second = c.wait(rid)["result"]
    if generation == MODERN and declare:
        task_id = handle_of({"result": second}, MODERN)
        assert c.outcome(task_id)["status"] == "completed"
    else:
        assert "task" not in second and second.get("resultType", "complete") == "complete"
    c.request("tools/call", call("list_threads"))  # a barrier: every earlier notification is in
    assert [n for n in c.notes if n.get("method") == STATUS] == []


def test_a_2026_task_is_polled_and_sends_no_notification(raw_clients):
    c = raw_clients(MODERN)
    task_id = make_task(c, "polled", "t")
    assert c.outcome(task_id)["status"] == "completed"
    assert statuses(c, task_id) == []
