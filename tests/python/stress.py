"""Stress: many `respond` calls across more thread ids than wisp keeps, with many
in flight, through the real shim and core (echo backend), checked for:

- every call answered exactly once (raw JSON-RPC, so a duplicate or stray reply is seen);
- no call failing;
- each thread id's echo N values consistent with its creations: every incarnation of a
  thread (created: true, N = 1) counts 1, 2, 3, … with no gap and no repeat, so per id the
  number of replies with N = k never exceeds those with N = k - 1, and N = 1 exactly when
  created is true (an evicted thread comes back as a new incarnation);
- never more live threads than the capacity (list_threads polled throughout);
- no deadlock: the whole run is bounded in time.

`make stress` runs the full size and prints the figures:
    python tests/python/stress.py --calls 10000
test_stress.py runs a short one inside `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import INITIALIZE, INITIALIZED, REPO, children, jsonrpc, rss_kib, shim_command, shim_env  # noqa: E402


@dataclass
class Figures:
    calls: int
    thread_ids: int
    capacity: int
    in_flight: int
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    max_live: int = 0
    polls: int = 0
    creates: int = 0
    live_at_end: int = 0
    errors: list[str] = field(default_factory=list)
    crash_errors: int = 0
    rss_kib: dict[str, tuple[int, int]] = field(default_factory=dict)  # process: (after warm-up, at the end)
    kills: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def evictions(self) -> int:
        return self.creates - self.live_at_end

    def summary(self) -> str:
        lat = sorted(self.latencies_ms)
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")  # noqa: E731
        return (
            f"stress: {self.calls} calls over {self.thread_ids} thread ids, capacity {self.capacity}, "
            f"{self.in_flight} in flight\n"
            f"  wall time      {self.wall_s:.2f} s ({self.calls / self.wall_s:.0f} calls/s)\n"
            f"  latency        p50 {p(0.50):.1f} ms, p99 {p(0.99):.1f} ms, max {lat[-1] if lat else 0:.1f} ms "
            f"(mean {statistics.fmean(lat) if lat else 0:.1f} ms, incl. the !sleep 0-20 ms)\n"
            f"  live threads   max {self.max_live} seen in {self.polls} polls (capacity {self.capacity}); {self.live_at_end} at the end\n"
            f"  threads        {self.creates} created, {self.evictions} evicted\n"
            f"  errors         {len(self.errors)}; problems {len(self.problems)}"
            + "".join(f"\n  rss {k:<10} {a / 1024:.0f} MiB after warm-up, {b / 1024:.0f} MiB at the end" for k, (a, b) in self.rss_kib.items())
            + (f"\n  core kills     {self.kills}: {self.crash_errors} calls failed with core_crashed/thread_lost" if self.kills else "")
        )


class RawClient:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.waiting: dict[int, asyncio.Future] = {}
        self.answers: Counter[int] = Counter()
        self.strays: list[bytes] = []
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            msg = json.loads(line)
            rid = msg.get("id")
            if rid is None:
                continue  # a notification
            self.answers[rid] += 1
            fut = self.waiting.pop(rid, None)
            if fut is None:
                self.strays.append(line[:200])
            elif not fut.done():
                fut.set_result(msg)
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(EOFError("wisp's stdout closed"))

    async def request(self, rid: int, data: bytes) -> dict:
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()
        return await fut


async def run(calls: int = 10_000, thread_ids: int = 64, capacity: int = 32, in_flight: int = 50,
              max_sleep_ms: int = 20, seed: int = 8, timeout_s: float = 600.0, core: str | None = None,
              kill_core_at: tuple[int, ...] = ()) -> Figures:
    """`kill_core_at`: call numbers at which the core is SIGKILLed; the calls it fails must
    fail with core_crashed or thread_lost (counted in `Figures.crash_errors`), all others
    as without the kills."""
    rng = random.Random(seed)
    fig = Figures(calls=calls, thread_ids=thread_ids, capacity=capacity, in_flight=in_flight)
    argv = shim_command(
        "--backend", "echo", "--max-threads", str(capacity),
        # No condensing (N then counts every turn) and no `busy` (the queue outgrows the calls in flight).
        "--context-size", "100000000", "--max-queue", str(in_flight + 1), "--log-level", "warning", core=core,
    )
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=shim_env(), cwd=REPO,
        limit=64 * 1024 * 1024,
    )
    client = RawClient(proc)
    try:
        init = await asyncio.wait_for(client.request(1, INITIALIZE), 30)
        assert "result" in init, init
        assert proc.stdin is not None
        proc.stdin.write(INITIALIZED)
        # As a client does: list the tools (which also starts the core), then one call and its
        # close, so the RSS below is read from a core that has answered.
        for rid, method, params in ((2, "tools/list", {}), (3, "tools/call", {"name": "respond", "arguments": {"prompt": "warm", "thread_id": "warm"}}),
                                    (4, "tools/call", {"name": "close_thread", "arguments": {"thread_id": "warm"}})):
            answer = await asyncio.wait_for(client.request(rid, jsonrpc(method, params, id=rid)), 30)
            assert "result" in answer and not answer["result"].get("isError"), answer

        ids = [f"s{i:02d}" for i in range(thread_ids)]
        results: dict[str, list[tuple[bool, int, int]]] = defaultdict(list)
        slots = asyncio.Semaphore(in_flight)
        finished = asyncio.Event()
        next_id = iter(range(1000, 10**9))

        async def one(i: int) -> None:
            tid = rng.choice(ids)
            prompt = f"!sleep {rng.randint(0, max_sleep_ms)} call {i}"  # kept: calls of mixed lengths are the load tested
            rid = next(next_id)
            t0 = time.perf_counter()
            try:
                msg = await client.request(rid, jsonrpc("tools/call", {"name": "respond", "arguments": {"prompt": prompt, "thread_id": tid}}, id=rid))
            finally:
                slots.release()
            fig.latencies_ms.append((time.perf_counter() - t0) * 1000)
            res = msg.get("result")
            if res is None or res.get("isError"):
                text = res["content"][0]["text"] if res else ""
                if kill_core_at and text.startswith(("core_crashed:", "thread_lost:")):
                    fig.crash_errors += 1
                else:
                    fig.errors.append(f"call {i} on {tid}: {json.dumps(msg)[:300]}")
                return
            s = res["structuredContent"]
            text = s["text"]
            head, _, rest = text.partition(": ")
            if not head.startswith("echo ") or rest != prompt or s["thread_id"] != tid:
                fig.problems.append(f"call {i} on {tid}: unexpected reply {text[:100]!r} for {prompt!r}")
                return
            n = int(head[5:])
            if s["turns"] != n:
                fig.problems.append(f"call {i} on {tid}: echo {n} but turns {s['turns']}")
            results[tid].append((s["created"], n, i))

        async def poll() -> None:
            while not finished.is_set():
                rid = next(next_id)
                msg = await client.request(rid, jsonrpc("tools/call", {"name": "list_threads", "arguments": {}}, id=rid))
                if not msg.get("result", {}).get("isError"):  # a poll may meet a killed core
                    live = len(msg["result"]["structuredContent"]["threads"])
                    fig.polls += 1
                    fig.max_live = max(fig.max_live, live)
                try:
                    await asyncio.wait_for(finished.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass

        async def drive() -> None:
            poller = asyncio.create_task(poll())
            tasks = []
            for i in range(calls):
                await slots.acquire()
                if i in kill_core_at and kill_core(proc.pid):
                    fig.kills += 1
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)
            finished.set()
            await poller

        rss_start = {"shim": rss_kib(proc.pid), "wisp-core": rss_kib(core_pid(proc.pid))}
        start = time.perf_counter()
        try:
            await asyncio.wait_for(drive(), timeout_s)
        except asyncio.TimeoutError:
            fig.problems.append(f"deadlock? {len(client.waiting)} call(s) still unanswered after {timeout_s:.0f} s")
        fig.wall_s = time.perf_counter() - start

        rid = next(next_id)
        final = await asyncio.wait_for(client.request(rid, jsonrpc("tools/call", {"name": "list_threads", "arguments": {}}, id=rid)), 30)
        live = final["result"]["structuredContent"]["threads"]
        fig.live_at_end = len(live)
        rss_end = {"shim": rss_kib(proc.pid), "wisp-core": rss_kib(core_pid(proc.pid))}
        fig.rss_kib = {k: (rss_start[k], rss_end[k]) for k in rss_start}
        fig.max_live = max(fig.max_live, len(live))
        await asyncio.sleep(0.3)  # kept: a late duplicate would arrive now; nothing marks its absence but a window

        # Exactly once.
        dup = {rid: n for rid, n in client.answers.items() if n != 1}
        if dup:
            fig.problems.append(f"answered more than once: {dict(list(dup.items())[:10])}")
        if client.strays:
            fig.problems.append(f"{len(client.strays)} replies to no request, e.g. {client.strays[:3]}")
        answered = sum(len(v) for v in results.values()) + len(fig.errors) + fig.crash_errors
        if answered != calls and not any("deadlock" in p for p in fig.problems):
            fig.problems.append(f"{calls} calls sent, {answered} answered")
        if fig.max_live > capacity:
            fig.problems.append(f"{fig.max_live} live threads seen, capacity {capacity}")
        fig.creates = sum(1 for rs in results.values() for created, _, _ in rs if created)
        fig.problems += check_sequences(results)
        live_ids = {t["thread_id"] for t in live}
        for t in live:
            rs = results.get(t["thread_id"], [])
            # The live incarnation holds the highest N of its latest run; at least it exists.
            if t["turns"] < 1 or not rs:
                fig.problems.append(f"live thread {t} has no calls")
        if not live_ids <= set(ids):
            fig.problems.append(f"unknown live threads: {live_ids - set(ids)}")
    finally:
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            fig.problems.append("wisp did not exit within 10 s of stdin EOF")
        client.reader.cancel()
    return fig


def core_pid(shim_pid: int) -> int | None:
    """The shim's running wisp-core child."""
    kids = children(shim_pid)
    return kids[0] if kids else None


def kill_core(shim_pid: int) -> int | None:
    """SIGKILL the shim's wisp-core child, if it has one running."""
    import os
    import signal

    pid = core_pid(shim_pid)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    return pid


def check_sequences(results: dict[str, list[tuple[bool, int, int]]]) -> list[str]:
    """Per thread id, replies as (created, N, call number): every incarnation must count
    1, 2, 3, ... once each, and N = 1 exactly when the call created the thread."""
    problems = []
    for tid, rs in results.items():
        for created, n, i in rs:
            if created != (n == 1):
                problems.append(f"{tid}: call {i} has created={created} with echo {n}")
        count = Counter(n for _, n, _ in rs)
        for n in sorted(count):
            if n > 1 and count[n] > count[n - 1]:
                problems.append(f"{tid}: {count[n]} replies with echo {n} but {count[n - 1]} with echo {n - 1}: {sorted(count.items())}")
                break
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=64, help="distinct thread ids")
    ap.add_argument("--capacity", type=int, default=32, help="--max-threads")
    ap.add_argument("--in-flight", type=int, default=50)
    ap.add_argument("--max-sleep-ms", type=int, default=20)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=600.0, help="the whole run's bound (a deadlock fails it)")
    a = ap.parse_args()
    fig = asyncio.run(run(a.calls, a.threads, a.capacity, a.in_flight, a.max_sleep_ms, a.seed, a.timeout))
    print(fig.summary())
    for line in (fig.errors + fig.problems)[:20]:
        print("  !", line)
    return 0 if not fig.errors and not fig.problems else 1


if __name__ == "__main__":
    sys.exit(main())
