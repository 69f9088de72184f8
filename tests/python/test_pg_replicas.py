"""Several wisps on one PostgreSQL (issue 47, item 6), end to end on a real PostgreSQL of the
test's own (initdb):

- three replicas: what one writes (continue, fork_from, rewind, close) each other reads, lists
  and continues;
- two replicas calling on one thread at once, round after round: every answered turn is in the
  thread's read at the place its reply numbered, none lost, none doubled;
- `--max-stored-threads` holds exactly across the fleet;
- (a replica killed with SIGKILL mid-turn: test_pg_store.py);
- the database stopped and started under calls from two replicas: each call is either answered
  and kept, or `store_unavailable` and kept nowhere, as the read shows.
Order is proven from the thread's read and echo's numbering, never from the clock.
"""

from __future__ import annotations

import asyncio

from harness import echo_n, error_text, ok, wisp
from harness.postgres import postgres


async def say(c, prompt: str, **args) -> dict:
    return ok(await c.call_tool("respond", {"prompt": prompt, **args}))


async def prompts(c, tid: str) -> list[str]:
    return [t["prompt"] for t in ok(await c.call_tool("read_thread", {"thread_id": tid}))["items"]]


async def ids(c) -> set[str]:
    return {t["thread_id"] for t in ok(await c.call_tool("list_threads", {}))["threads"]}


async def test_three_replicas_share_continue_fork_rewind_read_list_close():
    with postgres() as pg:
        url = pg.url()
        async with wisp("--store", url) as a, wisp("--store", url) as b, wisp("--store", url) as c:
            assert echo_n(await say(a, "one", thread_id="t")) == 1
            assert echo_n(await say(b, "two", thread_id="t")) == 2
            assert echo_n(await say(c, "three", thread_id="t")) == 3
            f = await say(b, "branch", fork_from="t", thread_id="f")
            assert (echo_n(f), f["created"]) == (4, True)
            r = await say(c, "instead", thread_id="t", rewind=1)
            assert (echo_n(r), r["turns"]) == (3, 3)
            for x in (a, b, c):
                assert await prompts(x, "t") == ["one", "two", "instead"]
                assert await prompts(x, "f") == ["one", "two", "three", "branch"]
                assert await ids(x) == {"t", "f"}
            assert echo_n(await say(a, "four", thread_id="t")) == 4
            ok(await c.call_tool("close_thread", {"thread_id": "t"}))
            for x in (a, b):
                assert await ids(x) == {"f"}
            fresh = await say(b, "afresh", thread_id="t")
            assert (echo_n(fresh), fresh["created"]) == (1, True)
            assert await prompts(a, "t") == ["afresh"]


async def until_answered(c, prompt: str, tid: str) -> dict:
    """A call on a thread the other replica may be holding: `busy` is the fleet-wide lease at
    work and is asked again; any other error fails the test."""
    while True:
        r = await c.call_tool("respond", {"prompt": prompt, "thread_id": tid})
        if not r.is_error:
            return r.structured_content
        assert error_text(r).startswith("busy"), error_text(r)


async def test_interleaved_calls_from_two_replicas_keep_every_turn_in_order():
    with postgres() as pg:
        url = pg.url()
        async with wisp("--store", url) as a, wisp("--store", url) as b:
            answered: dict[int, str] = {}
            for i in range(15):
                pair = await asyncio.gather(until_answered(a, f"a{i}", "t"), until_answered(b, f"b{i}", "t"))
                for r, p in zip(pair, (f"a{i}", f"b{i}")):
                    assert echo_n(r) not in answered, (answered, r)
                    answered[echo_n(r)] = p
            assert sorted(answered) == list(range(1, 31))
            for x in (a, b):
                assert await prompts(x, "t") == [answered[n] for n in range(1, 31)]


async def test_max_stored_threads_is_exact_across_replicas():
    with postgres() as pg:
        url = pg.url()
        async with wisp("--store", url, "--max-stored-threads", "3") as a, \
                wisp("--store", url, "--max-stored-threads", "3") as b:
            for i, x in enumerate((a, b, a, b, a)):
                await say(x, "1", thread_id=f"t{i}")
                assert len(await ids(a)) == min(i + 1, 3)
            # Five stored through two replicas, three kept: the two least recently updated went.
            assert await ids(b) == {"t2", "t3", "t4"}
            assert (await say(a, "back", thread_id="t0"))["created"]


async def test_database_stopped_and_started_under_calls_from_two_replicas():
    """Each worker calls on a thread of its own, so a call fails only through the database. The
    database stops once every worker has three answers, and starts again once every worker has
    had a call refused; workers go on until each has three answers after the return."""
    with postgres() as pg:
        url = pg.url()
        async with wisp("--store", url) as a, wisp("--store", url) as b:
            workers = [(x, f"{name}{k}") for x, name in ((a, "a"), (b, "b")) for k in range(3)]
            answered = {tid: {} for _, tid in workers}
            refused = {tid: 0 for _, tid in workers}
            after = {tid: 0 for _, tid in workers}
            phase = {"v": "up"}
            before_stop = asyncio.Barrier(len(workers) + 1)
            all_refused = asyncio.Event()
            restarted = asyncio.Event()

            async def work(c, tid: str) -> None:
                i = 0
                while after[tid] < 3:
                    i += 1
                    r = await c.call_tool("respond", {"prompt": f"{tid}-{i}", "thread_id": tid})
                    if r.is_error:
                        text = error_text(r)
                        assert text.startswith("store_unavailable") and phase["v"] != "up", text
                        refused[tid] += 1
                        if all(refused.values()):
                            all_refused.set()
                        continue
                    n = echo_n(r.structured_content)
                    assert n not in answered[tid], (tid, n, answered[tid])
                    answered[tid][n] = f"{tid}-{i}"
                    if restarted.is_set():
                        after[tid] += 1
                    if i == 3:
                        await before_stop.wait()

            async def operate() -> None:
                await before_stop.wait()
                phase["v"] = "stopping"
                await asyncio.to_thread(pg.stop)
                await asyncio.wait_for(all_refused.wait(), 60)
                await asyncio.to_thread(pg.start)
                restarted.set()

            await asyncio.wait_for(asyncio.gather(operate(), *(work(c, tid) for c, tid in workers)), 180)
            for _, tid in workers:
                kept = answered[tid]
                assert sorted(kept) == list(range(1, len(kept) + 1)), (tid, kept)
                assert await prompts(a, tid) == await prompts(b, tid) == [kept[n] for n in sorted(kept)]
                assert refused[tid] >= 1
