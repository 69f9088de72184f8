"""`make bench`'s `threadops` section: thread operations, medians over repeats (echo backend).

  fork_ms               `respond` with `fork_from` a 50-turn thread of 1 KB prompts (the copy and
                        its first turn, in memory)
  list_query_1000_ms    `list_threads` with a `query` over 1,000 stored threads of 3 turns that no
                        wisp holds in memory (a fresh wisp on the state dir), the word in turn 1 of one
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from clients import REPO, mcp_client, median, wisp_argv

THREADOPS_TARGETS: dict[str, tuple[float, str]] = {}

THREADOPS_ROWS = [
    ("fork_ms", "fork a 50-turn thread (ms)", "{:.2f}"),
    ("list_query_1000_ms", "list_threads query, 1,000 stored threads (ms)", "{:.1f}"),
]


async def _fork(repeats: int) -> list[float]:
    turn = "x" * 1000
    times = []
    async with mcp_client(wisp_argv()) as c:
        for i in range(50):
            assert not (await c.call_tool("respond", {"prompt": f"{i} {turn}", "thread_id": "src"})).is_error
        for _ in range(repeats):
            t = time.perf_counter()
            res = await c.call_tool("respond", {"prompt": "branch", "fork_from": "src"})
            times.append((time.perf_counter() - t) * 1e3)
            assert not res.is_error and res.structured_content["turns"] == 51, res
            await c.call_tool("close_thread", {"thread_id": res.structured_content["thread_id"]})
    return times


async def _list_query(threads: int, repeats: int) -> list[float]:
    parent = os.environ.get("WISP_BENCH_STATE_PARENT") or str(REPO / "bench")
    state = tempfile.mkdtemp(prefix=".threadops-state-", dir=parent)
    try:
        async with mcp_client(wisp_argv("--state-dir", state, "--max-stored-threads", str(threads))) as c:
            for i in range(threads):
                first = "the needle quokka" if i == threads // 2 else f"build step {i} failed"
                for prompt in (first, f"retry {i}", f"done {i}"):
                    assert not (await c.call_tool("respond", {"prompt": prompt, "thread_id": f"t{i:04}"})).is_error
        times = []
        async with mcp_client(wisp_argv("--state-dir", state, "--max-stored-threads", str(threads))) as c:
            await c.call_tool("list_threads", {"limit": 1})  # the core is up
            for _ in range(repeats):
                t = time.perf_counter()
                res = await c.call_tool("list_threads", {"query": "quokka"})
                times.append((time.perf_counter() - t) * 1e3)
                found = [x["thread_id"] for x in res.structured_content["threads"]]
                assert found == [f"t{threads // 2:04}"], found
        return times
    finally:
        shutil.rmtree(state, ignore_errors=True)


async def threadops_section(quick: bool) -> dict[str, Any]:
    forks = await _fork(repeats=5 if quick else 21)
    queries = await _list_query(1000, repeats=3 if quick else 9)
    return {
        "fork_ms": median(forks),
        "list_query_1000_ms": median(queries),
        "_runs": {"fork_ms": forks, "list_query_1000_ms": queries},
    }
