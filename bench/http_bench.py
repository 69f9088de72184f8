"""`make bench`'s `http` section: the shared server (`wisp --http`), measured as bench/run.py
measures the rest (medians over repeats, ratios against a baseline run at the same time).

  http_roundtrip_ratio_p50   `respond` through `wisp --http` / the bare SDK server over streamable
                             HTTP (bench/baseline_server.py --http, the same echo-like tool), the
                             same SDK client (2025-11-25, with a session) calling both, interleaved;
                             `_2026` is the same with 2026-07-28 clients (no session)
  http_clients_8_ratio       8 clients x `!sleep 500` at once, each on its own thread / one call
  http_rss_8_clients_mb      RSS of one `wisp --http` (shim + core) with 8 clients that made 50
                             calls of 1 KB each, against `stdio_rss_8_wisps_mb`: 8 stdio wisps that
                             did the same (echo backend: with the local model, each stdio wisp
                             also runs its own llama-server, which one shared server does not)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import subprocess
import tempfile
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from clients import PY, REPO, RawClient, child_env, interleaved_times, log, median, pct, rss_kb, wisp_argv

HTTP_TARGETS: dict[str, tuple[float, str]] = {
    "http_roundtrip_ratio_p50": (1.2, "max"),
    "http_clients_8_ratio": (1.1, "max"),
}

HTTP_ROWS = [
    ("http_roundtrip_ratio_p50", "HTTP round trip, wisp / bare SDK server (p50)", "{:.2f}"),
    ("http_roundtrip_wisp_p50_us", "  wisp p50 (us)", "{:.0f}"),
    ("http_roundtrip_baseline_p50_us", "  bare SDK server over HTTP p50 (us)", "{:.0f}"),
    ("http_roundtrip_ratio_p50_2026", "  the same, 2026-07-28 clients", "{:.2f}"),
    ("http_clients_8_ratio", "HTTP: 8 clients x !sleep 500 / one call", "{:.3f}"),
    ("http_rss_8_clients_mb", "RSS, one --http wisp with 8 clients (MB)", "{:.1f}"),
    ("stdio_rss_8_wisps_mb", "  8 stdio wisps, the same calls (MB)", "{:.1f}"),
]


class _Served:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url


@asynccontextmanager
async def _wisp_http(token: str) -> AsyncIterator[_Served]:
    with tempfile.TemporaryFile("w+") as errlog:
        proc = subprocess.Popen(wisp_argv("--http", "127.0.0.1:0"), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=errlog, env={**child_env(), "WISP_HTTP_TOKEN": token}, cwd=REPO)
        try:
            deadline = time.monotonic() + 30
            while True:
                errlog.seek(0)
                m = re.search(r"serving MCP at (http://\S+/mcp)", errlog.read())
                if m:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    errlog.seek(0)
                    raise RuntimeError("wisp --http did not start:\n" + errlog.read()[-4000:])
                await asyncio.sleep(0.02)
            yield _Served(proc, m.group(1))
        finally:
            _stop(proc)


@asynccontextmanager
async def _baseline_http() -> AsyncIterator[_Served]:
    proc = subprocess.Popen([PY, str(REPO / "bench" / "baseline_server.py"), "--http"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env(), cwd=REPO, text=True)
    try:
        line = await asyncio.to_thread(proc.stdout.readline)
        port = int(line.split()[1])
        yield _Served(proc, f"http://127.0.0.1:{port}/mcp")
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@asynccontextmanager
async def _client(url: str, token: str, mode: str = "legacy") -> AsyncIterator[Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as hc:
        async with Client(streamable_http_client(url, http_client=hc), mode=mode) as c:
            yield c


async def _call(c: Any, args: dict) -> None:
    res = await c.call_tool("respond", args)
    assert not res.is_error, res


async def roundtrip(calls: int, repeats: int) -> dict[str, Any]:
    runs = []
    token = secrets.token_urlsafe(32)
    for r in range(repeats):
        async with _wisp_http(token) as wisp, _baseline_http() as base:
            run: dict[str, float] = {}
            for mode, suffix in (("legacy", ""), ("2026-07-28", "_2026")):
                async with _client(wisp.url, token, mode) as w, _client(base.url, token, mode) as b:
                    first = await w.call_tool("respond", {"prompt": "hello"})
                    assert not first.is_error, first
                    args = {"prompt": "ping", "thread_id": first.structured_content["thread_id"]}
                    clients = {"wisp": w, "baseline": b}
                    times = await interleaved_times(clients, dict.fromkeys(clients, args), calls)
                for k, v in times.items():
                    run[f"{k}{suffix}_p50_us"] = pct(v, 0.5) * 1e6
                    run[f"{k}{suffix}_p99_us"] = pct(v, 0.99) * 1e6
                run[f"ratio{suffix}"] = run[f"wisp{suffix}_p50_us"] / run[f"baseline{suffix}_p50_us"]
        runs.append(run)
        log(f"http roundtrip {r + 1}/{repeats}: p50 wisp {run['wisp_p50_us']:.0f} us, baseline {run['baseline_p50_us']:.0f} us, "
             f"ratio {run['ratio']:.2f}; 2026-07-28 {run['wisp_2026_p50_us']:.0f} / {run['baseline_2026_p50_us']:.0f} us, "
             f"ratio {run['ratio_2026']:.2f}")
    out = {
        "http_roundtrip_ratio_p50": median([x["ratio"] for x in runs]),
        "http_roundtrip_ratio_p50_2026": median([x["ratio_2026"] for x in runs]),
    }
    for k in ("wisp", "baseline", "wisp_2026", "baseline_2026"):
        for q in ("p50", "p99"):
            out[f"http_roundtrip_{k}_{q}_us"] = median([x[f"{k}_{q}_us"] for x in runs])
    out["_runs"] = {"http_roundtrip": runs}
    return out


async def clients_8(repeats: int, sleep_ms: int = 500) -> dict[str, Any]:
    import anyio

    token = secrets.token_urlsafe(32)
    runs = []
    async with _wisp_http(token) as wisp, contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(_client(wisp.url, token, ("legacy", "2026-07-28")[i % 2])) for i in range(8)]
        for i, c in enumerate(clients):
            await _call(c, {"prompt": "warm", "thread_id": f"warm-{i}"})

        async def wall(pairs: list[tuple[Any, dict]]) -> float:
            t = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for c, args in pairs:
                    tg.start_soon(_call, c, args)
            return time.perf_counter() - t

        for r in range(repeats):
            one = await wall([(clients[0], {"prompt": f"!sleep {sleep_ms}", "thread_id": f"one-{r}"})])
            eight = await wall([(c, {"prompt": f"!sleep {sleep_ms}", "thread_id": f"eight-{r}-{i}"}) for i, c in enumerate(clients)])
            runs.append({"one_s": one, "eight_s": eight, "ratio": eight / one})
            log(f"http 8 clients {r + 1}/{repeats}: one {one * 1e3:.1f} ms, 8 at once {eight * 1e3:.1f} ms")
    return {
        "http_clients_8_ratio": median([x["ratio"] for x in runs]),
        "http_clients_8_one_call_ms": median([x["one_s"] for x in runs]) * 1e3,
        "http_clients_8_at_once_ms": median([x["eight_s"] for x in runs]) * 1e3,
        "_runs": {"http_clients_8": runs},
    }


PROMPT_1K = ("The quick brown fox jumps over the lazy dog. " * 24)[:1024]


async def memory(repeats: int, calls: int = 50) -> dict[str, Any]:
    """One shared server with 8 clients against 8 stdio wisps, each client making the same calls."""
    token = secrets.token_urlsafe(32)
    runs = []
    for r in range(repeats):
        async with _wisp_http(token) as wisp, contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(_client(wisp.url, token)) for _ in range(8)]

            async def work(i: int, c: Any) -> None:
                for _ in range(calls):
                    await _call(c, {"prompt": PROMPT_1K, "thread_id": f"mem-{i}"})

            await asyncio.gather(*(work(i, c) for i, c in enumerate(clients)))
            await asyncio.sleep(0.3)
            shared = rss_kb(wisp.proc.pid)
        stdio = 0
        wisps = [await RawClient.spawn(wisp_argv()) for _ in range(8)]
        try:
            for w in wisps:
                await w.initialize()

            async def work_stdio(i: int, w: RawClient) -> None:
                for _ in range(calls):
                    await w.call("respond", {"prompt": PROMPT_1K, "thread_id": f"mem-{i}"})

            await asyncio.gather(*(work_stdio(i, w) for i, w in enumerate(wisps)))
            await asyncio.sleep(0.3)
            stdio = sum(rss_kb(w.proc.pid) for w in wisps)
        finally:
            for w in wisps:
                await w.close()
        runs.append({"shared_mb": shared / 1024, "stdio_mb": stdio / 1024})
        log(f"http memory {r + 1}/{repeats}: one --http wisp with 8 clients {shared / 1024:.1f} MB, 8 stdio wisps {stdio / 1024:.1f} MB")
    return {
        "http_rss_8_clients_mb": median([x["shared_mb"] for x in runs]),
        "stdio_rss_8_wisps_mb": median([x["stdio_mb"] for x in runs]),
        "_runs": {"http_memory": runs},
    }


async def http_section(quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for part in (lambda: roundtrip(calls=100 if quick else 400, repeats=2 if quick else 5),
                 lambda: clients_8(repeats=2 if quick else 5),
                 lambda: memory(repeats=1 if quick else 3)):
        res = await part()
        runs.update(res.pop("_runs", {}))
        out.update(res)
    out["_runs"] = runs
    return out
