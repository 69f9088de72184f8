"""`make bench`'s `postgres` section: threads stored in PostgreSQL (`--store`), on a cluster of the
bench's own (tests/python/harness/postgres.py: initdb in a temporary directory, its Unix socket;
fsync on, as a server's default is), echo backend.

  postgres_turn_ratio  respond p50 with `--store postgresql://` / in memory, both wisps connected
                       at once and called in turn on one thread each (each turn commits, with
                       synchronous commit, before its reply)
  replicas_gain        16 threads of `!sleep 200` calls, 16 clients at once: calls per second
                       through two replicas on one database (8 clients each) / through one (all
                       16): above 1 only where one replica is the bottleneck; with echo's sleep
                       none is, so a figure near 1 says nothing serialises across replicas, and
                       below 1 says something does
  replicas_gain_busy   the same with plain calls (no sleep): the shim's CPU is the bottleneck of
                       one replica, so two can gain, up to the machine's CPUs
"""

from __future__ import annotations

import asyncio
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from harness.postgres import postgres  # noqa: E402

from clients import interleaved_times, log, mcp_client, median, wisp_argv  # noqa: E402

POSTGRES_TARGETS = {
    "postgres_turn_ratio": (1.6, "max"),
    "replicas_gain": (1.8, "min"),
}
POSTGRES_ROWS = [
    ("postgres_turn_ratio", "respond p50, --store PostgreSQL / in memory", "{:.2f}"),
    ("postgres_p50_us", "  PostgreSQL (us)", "{:.0f}"),
    ("postgres_memory_p50_us", "  in memory (us)", "{:.0f}"),
    ("replicas_gain", "16 threads x !sleep 200: 2 replicas / 1", "{:.2f}"),
    ("replicas_gain_busy", "  plain calls, two replicas / one", "{:.2f}"),
]


async def _turns(url: str, calls: int, repeats: int) -> dict[str, Any]:
    runs = []
    for r in range(repeats):
        async with mcp_client(wisp_argv()) as memory_, mcp_client(wisp_argv("--store", url)) as stored:
            clients = {"memory": memory_, "postgres": stored}
            args = {name: {"prompt": "ping", "thread_id": f"{name}-{r}"} for name in clients}
            times = await interleaved_times(clients, args, calls)
        run = {f"{k}_p50_us": (median(v) or 0) * 1e6 for k, v in times.items()}
        run["ratio"] = run["postgres_p50_us"] / run["memory_p50_us"]
        runs.append(run)
        log(f"postgres {r + 1}/{repeats}: p50 {run['postgres_p50_us']:.0f} us, in memory {run['memory_p50_us']:.0f} us, "
            f"ratio {run['ratio']:.2f}")
    return {
        "postgres_turn_ratio": median([x["ratio"] for x in runs]),
        "postgres_p50_us": median([x["postgres_p50_us"] for x in runs]),
        "postgres_memory_p50_us": median([x["memory_p50_us"] for x in runs]),
        "_runs": {"postgres_turns": runs},
    }


async def _throughput(url: str, replicas: int, prompt: str, rounds: int, tag: str) -> float:
    """Calls per second of 16 clients, each on its own thread, spread over `replicas` wisps."""
    async with AsyncExitStack() as stack:
        wisps = [await stack.enter_async_context(mcp_client(wisp_argv("--store", url))) for _ in range(replicas)]

        # The 16 clients' threads spread over the replicas, as a load balancer spreads sessions.
        async def one(i: int, calls: int) -> None:
            c = wisps[i % replicas]
            for k in range(calls):
                res = await c.call_tool("respond", {"prompt": f"{prompt} {k}", "thread_id": f"{tag}-{i}"})
                assert not res.is_error, res
        await asyncio.gather(*(one(i, 2) for i in range(16)))  # every thread exists, every replica warm
        t = time.perf_counter()
        await asyncio.gather(*(one(i, rounds) for i in range(16)))
        return 16 * rounds / (time.perf_counter() - t)


async def _gain(url: str, prompt: str, rounds: int, repeats: int, tag: str) -> tuple[float | None, list[dict]]:
    runs = []
    for r in range(repeats):
        one = await _throughput(url, 1, prompt, rounds, f"{tag}1-{r}")
        two = await _throughput(url, 2, prompt, rounds, f"{tag}2-{r}")
        runs.append({"one_per_s": one, "two_per_s": two, "gain": two / one})
        log(f"replicas {tag} {r + 1}/{repeats}: one {one:.0f} calls/s, two {two:.0f} calls/s, gain {two / one:.2f}")
    return median([x["gain"] for x in runs]), runs


async def postgres_section(quick: bool) -> dict[str, Any]:
    try:
        cluster = postgres(fsync=True)
        pg = cluster.__enter__()
    except BaseException as exc:  # the harness skips (pytest's Skipped) where PostgreSQL is absent
        why = str(exc) or type(exc).__name__
        log(f"postgres: skipped: {why}")
        return {"postgres_reason": why}
    try:
        url = pg.url()
        out = await _turns(url, calls=100 if quick else 300, repeats=1 if quick else 5)
        gain, sleepy = await _gain(url, "!sleep 200", rounds=3 if quick else 10, repeats=1 if quick else 3, tag="s")
        busy, plain = await _gain(url, "ping", rounds=20 if quick else 100, repeats=1 if quick else 3, tag="p")
        out.update(replicas_gain=gain, replicas_gain_busy=busy)
        out["_runs"].update(replicas_sleep=sleepy, replicas_plain=plain)
        return out
    finally:
        cluster.__exit__(None, None, None)
