"""A task's place under WISP_MAX_TASKS, as a client running tasks one after another sees it:
only running tasks and results not yet collected count; odd ttls are bounded or refused."""

from __future__ import annotations


import pytest

from harness import wait_until
from harness.tasks import GENERATIONS, LEGACY, call, handle_of, make_task


@pytest.mark.parametrize("generation", GENERATIONS)
def test_a_collected_task_frees_its_place(raw_clients, generation):
    c = raw_clients(generation, env={"WISP_MAX_TASKS": "2"})
    # Twice the bound, one after another, each collected before the next: none is refused.
    for i in range(4):
        task_id = make_task(c, f"round {i}", f"t{i}")
        assert c.outcome(task_id)["status"] == "completed", i
    # The collected record still answers a repeated poll until its ttl.
    assert c.request("tasks/get", {"taskId": task_id})["result"]["status"] == "completed"


def test_a_cancelled_task_frees_its_place_and_an_uncollected_one_does_not(raw_clients):
    c = raw_clients(LEGACY, env={"WISP_MAX_TASKS": "2"})
    for i in range(3):
        task_id = handle_of(c.wait(c.respond("!hold never kept", f"c{i}")), LEGACY)  # only the cancel ends it
        assert c.request("tasks/cancel", {"taskId": task_id})["result"]["status"] == "cancelled"
    done = [handle_of(c.wait(c.respond(f"kept {i}", f"k{i}")), LEGACY) for i in range(2)]
    for task_id in done:  # ended, but no one collected them: they still count
        assert wait_until(lambda task_id=task_id: c.request("tasks/get", {"taskId": task_id})["result"]["status"] == "completed", 30)
    refused = c.wait(c.respond("one too many", "k3"))
    assert refused["error"]["code"] == -32000 and "not yet collected" in refused["error"]["message"]
    assert "result" in c.request("tasks/result", {"taskId": done[0]})
    assert "task" in c.wait(c.respond("now there is room", "k3"))["result"]


@pytest.mark.parametrize("ttl", [0, -5, 10**30])
def test_an_odd_ttl_is_bounded_and_the_handle_says_so(raw_clients, ttl):
    c = raw_clients(LEGACY, env={"WISP_TASK_TTL": "5"})
    rid = c.start("tools/call", {**call("respond", prompt="x", thread_id="t"), "task": {"ttl": ttl}})
    assert c.wait(rid)["result"]["task"]["ttl"] == (5000 if ttl > 0 else 1000)


@pytest.mark.parametrize("ttl", [1.5, "soon", None, [1]])
def test_a_ttl_that_is_no_whole_number_is_refused_clearly(raw_clients, ttl):
    c = raw_clients(LEGACY)
    rid = c.start("tools/call", {**call("respond", prompt="x", thread_id="t"), "task": {"ttl": ttl}})
    reply = c.wait(rid)
    if ttl is None:  # no ttl asked for: wisp's own
        assert reply["result"]["task"]["ttl"] == 3600 * 1000
    else:
        assert reply["error"]["code"] == -32602 and "ttl" in reply["error"]["message"], reply
    assert "result" in c.request("tools/call", call("list_threads"))  # the server is still up
