"""`make bench`: what wisp costs, measured side by side with baselines in the same run.

    .venv/bin/python bench/run.py [--quick] [--out bench/results/latest.json] [--only NAME ...]

Every figure is a median over repeated runs (p99 too for latencies), and every ratio is taken
against its baseline measured in the same run, interleaved with wisp so that both see the same
machine load. Sections (see bench/README.md for what each means):

  roundtrip   `respond` through wisp (echo backend, one thread) vs the same SDK client calling
              bench/baseline_server.py, a bare `mcp` SDK server whose tool returns its input
  pipe        shim <-> core round trip alone, through the shim's own core client (no MCP), on
              the shim's own event loop (wisp_shim/loop.py)
  concurrency 32 threads x `!sleep 500` at once vs one such call; 8 calls queued on one thread
  cold_start  spawn -> initialize -> tools/list answered, wisp vs the baseline server
  memory      RSS of shim + core: idle, after 32 threads x 50 turns of 1 KB, growth over 10,000
              create/close cycles
  bytes       bytes a caller sends over a scripted 20-turn job: thread vs resending the history
  tokens      tokens/s through wisp vs straight to the same local llama-server (when installed)
  schema      structured output on the local model: share of 20 calls with a schema whose value
              validates, and call time with the schema / the same prompt without it (when installed)
  durable     a turn with --state-dir (written and fsynced before the reply) vs an in-memory
              one, threads of up to 50 turns; the first call on a stored 50-turn thread after
              a restart (resume); list_threads with 1,000 stored threads (its first page, and
              all of them, 100 a page). The state dir is made under bench/
              (WISP_BENCH_STATE_PARENT moves it), not in a tmpfs /tmp where fsync costs nothing.
  real_concurrency
              4 threads asking the local model at once vs one alone: aggregate tokens/s and the
              last caller's time to first token, through wisp; the same straight to llama-server
              with wisp's slots and with one slot (when installed)
  http        the shared server (`wisp --http`): round trip vs the bare SDK server over streamable
              HTTP, 8 clients at once vs one call, RSS of one server with 8 clients vs 8 stdio
              wisps (bench/http_bench.py)
  precount    the tokens the core counts for a request before sending it vs the prompt_tokens
              llama-server reports, on 20 calls of mixed length; the old count beside it (when
              installed; bench/precount_bench.py)
  progress    a 1 MB streamed answer with a progress token vs without (bench/progress_bench.py)
  fleet       several model servers: pinned threads on the busiest of 3 endpoints / the least busy
              (scripted servers), and a follow-up turn on its thread's own endpoint / after a move
              (two local llama-servers, when installed; bench/fleet_bench.py)
  long, long_interleaved, long_12on8, long_resume, long_no_reuse
              long threads on the local model: time to first token of turn 20 / turn 1 within
              the context (and resent whole), of the turns after condensing / turn 1, one thread
              and 8 interleaved; 12 threads on 8 slots; durable threads after a restart (when
              installed; bench/long_threads.py says how; together about 30 min on 2 vCPUs)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from clients import (CORE, REPO, RawClient, all_threads, baseline_argv, interleaved_times, log, mcp_client,  # noqa: E402
                     median, pct, rss_kb, wisp_argv)
import long_threads  # noqa: E402

# key: (target, "max" | "min": whether the figure must stay below or above it)
TARGETS: dict[str, tuple[float, str]] = {
    "roundtrip_ratio_p50": (1.2, "max"),
    "roundtrip_added_p50_us_same_transport": (150, "max"),
    "pipe_p50_us": (100, "max"),
    "concurrency_ratio": (1.05, "max"),
    "serial_ratio": (0.95, "min"),
    "cold_start_ratio": (1.0, "max"),
    "rss_idle_mb": (80, "max"),
    "rss_32x50_mb": (100, "max"),
    "rss_growth_10k_mb": (2, "max"),
    "caller_bytes_ratio": (0.15, "max"),
    "files_caller_bytes_ratio": (0.02, "max"),
    "real_tokens_per_s_ratio": (0.95, "min"),
    "schema_valid_rate": (1.0, "min"),
    "durable_turn_ratio": (1.3, "max"),
    "real_concurrency_throughput_ratio": (1.3, "min"),
    "real_concurrency_gain_vs_direct": (0.95, "min"),
    "real_turn_ttft_ratio_20": (1.5, "max"),
    "real_turn_ttft_ratio_condensed": (2.0, "max"),
    "real_turn_ttft_ratio_20_interleaved": (1.5, "max"),
    "real_turn_ttft_ratio_condensed_interleaved": (2.0, "max"),
    "condensed_turn_tokens_ratio_no_reuse": (2.0, "max"),
}



# --- roundtrip ----------------------------------------------------------------------------


async def roundtrip(calls: int, repeats: int) -> dict[str, Any]:
    """One wisp thread and the baselines, all connected at once, called in turn.

    Two baselines: the bare SDK server as the SDK ships it (the figure the target is about),
    and the same server on wisp's stdio transport (transport/stdio.py), which shows what wisp's threads,
    pipe and core add once the transport, where wisp is faster than the SDK, is taken out."""
    runs = []
    for r in range(repeats):
        async with mcp_client(baseline_argv()) as base, mcp_client(baseline_argv("--wisp-stdio")) as same, \
                mcp_client(wisp_argv()) as wisp:
            first = await wisp.call_tool("respond", {"prompt": "hello"})
            assert not first.is_error, first
            args = {"prompt": "ping", "thread_id": first.structured_content["thread_id"]}
            clients = {"baseline": base, "same_transport": same, "wisp": wisp}
            times = await interleaved_times(clients, dict.fromkeys(clients, args), calls)
        run = {f"{k}_{q}_us": pct(v, f) * 1e6 for k, v in times.items() for q, f in (("p50", 0.5), ("p99", 0.99))}
        run["ratio_p50"] = run["wisp_p50_us"] / run["baseline_p50_us"]
        run["ratio_p50_same_transport"] = run["wisp_p50_us"] / run["same_transport_p50_us"]
        run["added_p50_us_same_transport"] = run["wisp_p50_us"] - run["same_transport_p50_us"]
        runs.append(run)
        log(f"roundtrip {r + 1}/{repeats}: p50 wisp {run['wisp_p50_us']:.0f} us, baseline {run['baseline_p50_us']:.0f} us, "
            f"baseline on wisp's transport {run['same_transport_p50_us']:.0f} us; ratio {run['ratio_p50']:.2f}")
    out = {
        "roundtrip_ratio_p50": median([x["ratio_p50"] for x in runs]),
        "roundtrip_ratio_p50_same_transport": median([x["ratio_p50_same_transport"] for x in runs]),
        "roundtrip_added_p50_us_same_transport": median([x["added_p50_us_same_transport"] for x in runs]),
    }
    for k in ("wisp", "baseline", "same_transport"):
        for q in ("p50", "p99"):
            out[f"roundtrip_{k}_{q}_us"] = median([x[f"{k}_{q}_us"] for x in runs])
    out["_runs"] = {"roundtrip": runs}
    return out


# --- pipe ---------------------------------------------------------------------------------


async def pipe(calls: int, repeats: int, idle_ms: float = 2.0) -> dict[str, Any]:
    """The shim's own core client (wisp_shim.core.client.Core) against wisp-core, no MCP at all:
    calls back to back (the target), then calls with `idle_ms` of idle between them, as an
    MCP client's calls come (both processes' vCPUs go idle in between, and waking them is
    most of what a call costs then)."""
    from wisp_shim.core.client import Core
    from wisp_shim.core.process import CoreLaunch

    runs = []
    for r in range(repeats):
        core = Core(CoreLaunch(core=str(CORE), args=["--backend", "echo", "--context-size", "100000000", "--log-level", "warning"]))
        core.start()
        try:
            tid = (await core.respond("hello")).thread_id
            for _ in range(max(50, calls // 10)):
                await core.respond("ping", thread_id=tid)
            ts = []
            for _ in range(calls):
                t = time.perf_counter()
                await core.respond("ping", thread_id=tid)
                ts.append(time.perf_counter() - t)
            idle = []
            for _ in range(calls // 10):
                await asyncio.sleep(idle_ms / 1000)
                t = time.perf_counter()
                await core.respond("ping", thread_id=tid)
                idle.append(time.perf_counter() - t)
        finally:
            await core.aclose()
        runs.append({"p50_us": pct(ts, 0.5) * 1e6, "p99_us": pct(ts, 0.99) * 1e6, "idle_p50_us": pct(idle, 0.5) * 1e6})
        log(f"pipe {r + 1}/{repeats}: p50 {runs[-1]['p50_us']:.0f} us, p99 {runs[-1]['p99_us']:.0f} us; "
            f"with {idle_ms:g} ms idle between calls p50 {runs[-1]['idle_p50_us']:.0f} us")
    return {
        "pipe_p50_us": median([x["p50_us"] for x in runs]),
        "pipe_p99_us": median([x["p99_us"] for x in runs]),
        "pipe_idle_p50_us": median([x["idle_p50_us"] for x in runs]),
        "_runs": {"pipe": runs},
    }


# --- concurrency --------------------------------------------------------------------------


async def concurrency(repeats: int, sleep_ms: int = 500) -> dict[str, Any]:
    """32 calls at once on 32 threads vs one call; 8 calls at once on one thread. The same
    client also drives the baseline server's `!sleep` in the same pattern, interleaved: what
    32 concurrent calls cost this client and the SDK alone, on this machine, at this moment."""
    import anyio

    prompt = f"!sleep {sleep_ms}"
    runs = []
    async with mcp_client(wisp_argv()) as wisp, mcp_client(baseline_argv("--wisp-stdio")) as base:
        await wisp.call_tool("respond", {"prompt": "warm"})
        await base.call_tool("respond", {"prompt": "warm"})

        async def call(client: Any, args: dict) -> None:
            res = await client.call_tool("respond", args)
            assert not res.is_error, res

        async def wall(client: Any, calls: list[dict]) -> float:
            t = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for args in calls:
                    tg.start_soon(call, client, args)
            return time.perf_counter() - t

        for r in range(repeats):
            one = await wall(wisp, [{"prompt": prompt, "thread_id": f"one-{r}"}])
            par = await wall(wisp, [{"prompt": prompt, "thread_id": f"par-{r}-{i}"} for i in range(32)])
            ser = await wall(wisp, [{"prompt": prompt, "thread_id": f"ser-{r}"} for _ in range(8)])
            b_one = await wall(base, [{"prompt": prompt}])
            b_par = await wall(base, [{"prompt": prompt} for _ in range(32)])
            runs.append({"one_s": one, "parallel32_s": par, "serial8_s": ser,
                         "concurrency_ratio": par / one, "serial_ratio": ser / (8 * one),
                         "baseline_one_s": b_one, "baseline_parallel32_s": b_par, "baseline_concurrency_ratio": b_par / b_one})
            log(f"concurrency {r + 1}/{repeats}: one {one * 1e3:.1f} ms, 32 parallel {par * 1e3:.1f} ms, 8 serial {ser * 1e3:.1f} ms; "
                f"baseline one {b_one * 1e3:.1f} ms, 32 parallel {b_par * 1e3:.1f} ms")
    return {
        "concurrency_ratio": median([x["concurrency_ratio"] for x in runs]),
        "serial_ratio": median([x["serial_ratio"] for x in runs]),
        "concurrency_ratio_baseline": median([x["baseline_concurrency_ratio"] for x in runs]),
        "concurrency_one_call_ms": median([x["one_s"] for x in runs]) * 1e3,
        "concurrency_32_parallel_ms": median([x["parallel32_s"] for x in runs]) * 1e3,
        "concurrency_8_serial_ms": median([x["serial8_s"] for x in runs]) * 1e3,
        "_runs": {"concurrency": runs},
    }


# --- cold start ---------------------------------------------------------------------------


async def _cold(argv: list[str]) -> float:
    t = time.perf_counter()
    c = await RawClient.spawn(argv)
    try:
        await c.initialize()
        tools = await c.request("tools/list", {})
        elapsed = time.perf_counter() - t
        assert tools["tools"], tools
    finally:
        await c.close()
    return elapsed


async def cold_start(repeats: int) -> dict[str, Any]:
    """Wall time from spawn until tools/list is answered, alternating wisp and the baseline
    (a raw JSON-RPC client, so that no client library's import time is in the figure).
    wisp's .pyc files are written first, as an install writes them: run from the source tree
    under PYTHONDONTWRITEBYTECODE, every start would compile the shim again."""
    import compileall

    compileall.compile_dir(str(REPO / "python" / "wisp_shim"), quiet=1)
    await _cold(baseline_argv())  # warm the page cache and .pyc files for both
    await _cold(wisp_argv())
    runs = []
    for r in range(repeats):
        b = await _cold(baseline_argv())
        w = await _cold(wisp_argv())
        runs.append({"wisp_ms": w * 1e3, "baseline_ms": b * 1e3, "ratio": w / b})
    log("cold start: " + ", ".join(f"{x['wisp_ms']:.0f}/{x['baseline_ms']:.0f} ms" for x in runs))
    return {
        "cold_start_ratio": median([x["ratio"] for x in runs]),
        "cold_start_wisp_ms": median([x["wisp_ms"] for x in runs]),
        "cold_start_baseline_ms": median([x["baseline_ms"] for x in runs]),
        "_runs": {"cold_start": runs},
    }


# --- memory -------------------------------------------------------------------------------


async def _settled_rss(pid: int) -> int:
    await asyncio.sleep(0.3)
    return rss_kb(pid)


async def memory(repeats: int, cycles: int, growth_repeats: int) -> dict[str, Any]:
    kib = 1024.0
    prompt_1k = ("The quick brown fox jumps over the lazy dog. " * 24)[:1024]
    runs = []
    for r in range(repeats):
        c = await RawClient.spawn(wisp_argv())
        try:
            await c.initialize()
            await c.call("list_threads", {"limit": 1})  # the core is up
            idle = await _settled_rss(c.proc.pid)

            async def worker(i: int, c: RawClient = c) -> None:
                tid = f"mem-{i}"
                for _ in range(50):
                    await c.call("respond", {"prompt": prompt_1k, "thread_id": tid})

            await asyncio.gather(*(worker(i) for i in range(32)))
            threads, _ = await all_threads(lambda a, c=c: c.call("list_threads", a))
            assert len(threads) == 32 and all(t["turns"] == 50 for t in threads), threads
            loaded = await _settled_rss(c.proc.pid)
        finally:
            await c.close()
        runs.append({"idle_mb": idle / kib, "32x50_mb": loaded / kib})
        log(f"memory {r + 1}/{repeats}: idle {idle / kib:.1f} MB, 32x50 {loaded / kib:.1f} MB")

    growth = []
    for r in range(growth_repeats):
        c = await RawClient.spawn(wisp_argv())
        try:
            await c.initialize()

            async def cycle(n: int, c: RawClient = c) -> None:
                for _ in range(n):
                    out = await c.call("respond", {"prompt": "hello"})
                    await c.call("close_thread", {"thread_id": out["thread_id"]})

            lanes = 8
            # Warm-up: first-use allocations (caches, pools, the allocator's arenas) are not growth.
            await asyncio.gather(*(cycle(25) for _ in range(lanes)))
            before = await _settled_rss(c.proc.pid)
            t = time.perf_counter()
            await asyncio.gather(*(cycle(cycles // lanes) for _ in range(lanes)))
            took = time.perf_counter() - t
            after = await _settled_rss(c.proc.pid)
            threads, _ = await all_threads(lambda a, c=c: c.call("list_threads", a))
            assert not threads, threads
        finally:
            await c.close()
        growth.append({"before_mb": before / kib, "after_mb": after / kib, "growth_mb": (after - before) / kib, "seconds": took})
        log(f"growth {r + 1}/{growth_repeats}: {before / kib:.1f} -> {after / kib:.1f} MB over {cycles} cycles ({took:.1f} s)")
    return {
        "rss_idle_mb": median([x["idle_mb"] for x in runs]),
        "rss_32x50_mb": median([x["32x50_mb"] for x in runs]),
        "rss_growth_10k_mb": median([x["growth_mb"] for x in growth]),
        "_runs": {"memory": runs, "growth": growth},
    }


# --- caller bytes -------------------------------------------------------------------------


def _job() -> list[str]:
    """A scripted 20-turn build-fix loop: a task with a 3 KB file, then 19 rounds of ~400 B of
    compiler or test output."""
    source = "".join(f"def f{i}(x):\n    return x * {i} + helper(x, {i})  # step {i}\n" for i in range(50))[:3000]
    turns = [f"Fix the failing build. Here is src/calc.py:\n```\n{source}\n```\nReply with a unified diff."]
    for i in range(1, 20):
        turns.append(
            f"Build {i} still fails:\nsrc/calc.py:{10 + i}: error: name 'helper{i}' is not defined\n"
            + f"  in f{i}: return x * {i} + helper{i}(x, {i})\n" * 4
            + f"tests/test_calc.py::test_f{i} FAILED (expected {i * 7}, got {i * 7 + 1})\nPlease send the next diff."
        )
    return turns


async def caller_bytes() -> dict[str, Any]:
    """Bytes the SDK client writes for the job's tools/call requests (the session's handshake,
    identical either way, is left out): with a thread, then resending the transcript each time."""
    turns = _job()
    threaded = {"bytes": 0, "messages": 0}
    replies: list[str] = []
    async with mcp_client(wisp_argv(), threaded) as wisp:
        threaded.update(bytes=0, messages=0)
        tid = None
        for prompt in turns:
            res = await wisp.call_tool("respond", {"prompt": prompt, **({"thread_id": tid} if tid else {})})
            assert not res.is_error, res
            tid = res.structured_content["thread_id"]
            replies.append(res.structured_content["text"])
        await wisp.call_tool("close_thread", {"thread_id": tid})
        thread_bytes = threaded["bytes"]

        resent = {"bytes": 0, "messages": 0}
        async with mcp_client(wisp_argv(), resent) as stateless:
            resent.update(bytes=0, messages=0)
            history = ""
            for prompt, reply in zip(turns, replies):
                res = await stateless.call_tool("respond", {"prompt": history + f"User: {prompt}\n"})
                assert not res.is_error, res
                history += f"User: {prompt}\nAssistant: {reply}\n"
            resend_bytes = resent["bytes"]
    log(f"bytes: thread {thread_bytes} B, resend {resend_bytes} B")
    files = await _files_caller_bytes()
    return {
        "caller_bytes_ratio": thread_bytes / resend_bytes,
        "caller_bytes_thread": thread_bytes,
        "caller_bytes_resend": resend_bytes,
        **files,
    }


def _build_log(size: int = 40 * 1024) -> str:
    lines, n = [], 0
    while sum(map(len, lines)) < size:
        n += 1
        lines.append(f"[{n:05d}] cc -c src/module{n % 97}.c -o build/module{n % 97}.o: ok\n")
    return "".join(lines)[:size]


async def _files_caller_bytes() -> dict[str, Any]:
    """"Summarise this 40 KB build log": the caller's bytes for the tools/call with `files`
    (wisp reads the file) against pasting the log into `prompt`."""
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        Path(root, "build.log").write_text(_build_log())
        prompt = "Summarise build.log: what failed, and why?"
        sent = {"bytes": 0, "messages": 0}
        async with mcp_client(wisp_argv("--root", root), sent) as wisp:
            sent.update(bytes=0, messages=0)
            res = await wisp.call_tool("respond", {"prompt": prompt, "files": ["build.log"]})
            assert not res.is_error, res
            with_files = sent["bytes"]
            sent.update(bytes=0, messages=0)
            res = await wisp.call_tool("respond", {"prompt": prompt + "\n\n" + Path(root, "build.log").read_text()})
            assert not res.is_error, res
            pasted = sent["bytes"]
    log(f"bytes: 40 KB file attached {with_files} B, pasted {pasted} B")
    return {"files_caller_bytes_ratio": with_files / pasted, "files_caller_bytes_attached": with_files,
            "files_caller_bytes_pasted": pasted}


# --- real model ---------------------------------------------------------------------------

TOKENS_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _direct_chat(endpoint: str, model: str, max_tokens: int) -> tuple[float, int]:
    """One streamed chat completion straight to llama-server, as wisp's openai backend sends it."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(endpoint)
    body = json.dumps({
        "model": model, "messages": [{"role": "user", "content": TOKENS_PROMPT}], "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.0, "max_tokens": max_tokens,
    })
    t = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", u.path + "/chat/completions", body, {"Content-Type": "application/json", "Accept": "text/event-stream"})
    resp = conn.getresponse()
    tokens = 0
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        event = json.loads(line[5:])
        if event.get("usage"):
            tokens = event["usage"].get("completion_tokens", tokens)
    conn.close()
    return time.perf_counter() - t, tokens


def _local_model() -> tuple[Path, Path] | str:
    """The installed llama-server and GGUF, or why they are not there."""
    from wisp_shim.localmodel import local_model

    try:
        binary = local_model.find_server()
        gguf = local_model.find_model()
    except local_model.LocalModelError as exc:
        binary, gguf, why = None, None, str(exc)
    else:
        why = "no llama.cpp server" if binary is None else "no SmolLM2 GGUF" if gguf is None else ""
    if binary is None or gguf is None:
        return f"the local model is not installed ({why}; `make local-model` installs it)"
    return binary, gguf


def _output_tokens(sc: dict[str, Any]) -> int:
    """The tokens a respond result says the model wrote (its `usage`)."""
    return int((sc.get("usage") or {}).get("output_tokens") or 0)


async def real_tokens(repeats: int, max_tokens: int = 128) -> dict[str, Any]:
    from wisp_shim.localmodel import local_model

    found = _local_model()
    if isinstance(found, str):
        log(f"tokens: skipped: {found}")
        return {"real_tokens_per_s_ratio": None, "real_tokens_per_s_reason": found}
    binary, gguf = found

    lm = local_model.LocalModel.of(binary, gguf, api_key="")
    await lm.ensure_running()
    runs = []
    try:
        async with mcp_client(wisp_argv("--endpoint", lm.endpoint, "--model", lm.alias, backend="openai")) as wisp:
            args = {"prompt": TOKENS_PROMPT, "temperature": 0.0, "max_output_tokens": max_tokens}

            async def through_wisp() -> tuple[float, int]:
                t = time.perf_counter()
                res = await wisp.call_tool("respond", args)
                took = time.perf_counter() - t
                assert not res.is_error, res
                sc = res.structured_content
                await wisp.call_tool("close_thread", {"thread_id": sc["thread_id"]})
                return took, _output_tokens(sc)

            async def direct() -> tuple[float, int]:
                return await asyncio.to_thread(_direct_chat, lm.endpoint, lm.alias, max_tokens)

            await through_wisp()  # warm: model pages, prompt cache, the core's first connection
            await direct()
            for r in range(repeats):
                order = (("wisp", through_wisp), ("direct", direct)) if r % 2 == 0 else (("direct", direct), ("wisp", through_wisp))
                run: dict[str, float] = {}
                for name, fn in order:
                    took, tokens = await fn()
                    run[f"{name}_tokens"] = tokens
                    run[f"{name}_tps"] = tokens / took
                run["ratio"] = run["wisp_tps"] / run["direct_tps"]
                runs.append(run)
                log(f"tokens {r + 1}/{repeats}: wisp {run['wisp_tps']:.1f} tok/s ({run['wisp_tokens']}), direct {run['direct_tps']:.1f} tok/s ({run['direct_tokens']})")
    finally:
        lm.stop()
    return {
        "real_tokens_per_s_ratio": median([x["ratio"] for x in runs]),
        "real_tokens_per_s_wisp": median([x["wisp_tps"] for x in runs]),
        "real_tokens_per_s_direct": median([x["direct_tps"] for x in runs]),
        "real_tokens_model": f"{lm.alias} ({gguf.name}) on {lm.kind}, {max_tokens} max tokens, temperature 0",
        "_runs": {"tokens": runs},
    }


# --- structured output --------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "severity": {"type": "string", "enum": ["error", "warning", "note"]},
        "line": {"type": "integer", "minimum": 1, "maximum": 10000},
        "files": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9_./-]{1,40}$"}, "minItems": 1, "maxItems": 3},
    },
    "required": ["severity", "line", "files"],
    "additionalProperties": False,
}
SCHEMA_PROMPTS = [
    "main.c:12: error: 'x' undeclared. Classify this compiler message as JSON with severity, line and files.",
    "util.h:40: warning: unused variable 'y'. Classify this compiler message as JSON with severity, line and files.",
    "lib/io.c:7: note: declared here. Classify this compiler message as JSON with severity, line and files.",
    "src/app.swift:88: error: cannot find 'foo' in scope. Classify this compiler message as JSON with severity, line and files.",
]


async def schema_output(calls: int = 20, max_tokens: int = 200) -> dict[str, Any]:
    """Validity of constrained output over `calls` calls, and its cost: each schema call is paired
    with the same prompt without the schema (order alternating), so both see the same load."""
    import jsonschema

    from wisp_shim.localmodel import local_model

    found = _local_model()
    if isinstance(found, str):
        log(f"schema: skipped: {found}")
        return {"schema_valid_rate": None, "schema_latency_ratio": None, "schema_reason": found}
    binary, gguf = found
    lm = local_model.LocalModel.of(binary, gguf, api_key="")
    await lm.ensure_running()
    runs: list[dict[str, Any]] = []
    try:
        async with mcp_client(wisp_argv("--endpoint", lm.endpoint, "--model", lm.alias, backend="openai")) as wisp:

            async def call(prompt: str, schema: dict | None) -> tuple[float, Any, int]:
                args: dict[str, Any] = {"prompt": prompt, "temperature": 0.7, "max_output_tokens": max_tokens}
                if schema is not None:
                    args["schema"] = schema
                t = time.perf_counter()
                res = await wisp.call_tool("respond", args)
                took = time.perf_counter() - t
                if res.is_error:
                    text = res.content[0].text if res.content else ""
                    assert text.startswith("invalid_output:"), text  # anything else is a broken run
                    return took, None, 0
                sc = res.structured_content
                await wisp.call_tool("close_thread", {"thread_id": sc["thread_id"]})
                return took, sc.get("output", None) if schema is not None else sc["text"], _output_tokens(sc)

            await call(SCHEMA_PROMPTS[0], SCHEMA)  # warm: model pages, the schema's grammar path
            await call(SCHEMA_PROMPTS[0], None)
            for i in range(calls):
                prompt = SCHEMA_PROMPTS[i % len(SCHEMA_PROMPTS)]
                order = ((True, SCHEMA), (False, None)) if i % 2 == 0 else ((False, None), (True, SCHEMA))
                run: dict[str, Any] = {}
                for constrained, schema in order:
                    took, value, tokens = await call(prompt, schema)
                    key = "schema" if constrained else "plain"
                    run[f"{key}_s"] = took
                    run[f"{key}_tokens"] = tokens
                    if constrained:
                        valid = value is not None and jsonschema.Draft202012Validator(SCHEMA).is_valid(value)
                        run["valid"] = valid
                runs.append(run)
                log(f"schema {i + 1}/{calls}: {'valid' if run['valid'] else 'INVALID'}, "
                    f"{run['schema_s'] * 1000:.0f} ms ({run['schema_tokens']} tok) vs {run['plain_s'] * 1000:.0f} ms ({run['plain_tokens']} tok) without")
    finally:
        lm.stop()
    return {
        "schema_valid_rate": sum(r["valid"] for r in runs) / len(runs),
        "schema_latency_ratio": median([r["schema_s"] for r in runs]) / median([r["plain_s"] for r in runs]),
        "schema_ms_with": median([r["schema_s"] * 1000 for r in runs]),
        "schema_ms_without": median([r["plain_s"] * 1000 for r in runs]),
        "schema_tokens_with": median([r["schema_tokens"] for r in runs]),
        "schema_tokens_without": median([r["plain_tokens"] for r in runs]),
        # Prose without a schema usually runs longer than the JSON, so per token is the fairer cost.
        "schema_ms_per_token_ratio": median([r["schema_s"] / max(r["schema_tokens"], 1) for r in runs])
        / median([r["plain_s"] / max(r["plain_tokens"], 1) for r in runs]),
        "schema_model": f"{lm.alias} ({gguf.name}) on {lm.kind}, {calls} calls, {max_tokens} max tokens, temperature 0.7",
        "_runs": {"schema": runs},
    }
# --- real model, 4 threads at once -------------------------------------------------------

# Four different asks that each run past CONCURRENT_TOKENS, so every caller decodes as long.
CONCURRENT_PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a short story about a baker who wakes up able to hear bread rising.",
    "Write a short story about a girl who builds a radio that reaches the past.",
    "Write a short story about an old dog who guards a forgotten train station.",
]
CONCURRENT_TOKENS = 64


def _direct_stream(endpoint: str, model: str, prompt: str, max_tokens: int, t0: float) -> tuple[float, float, int]:
    """One streamed chat completion straight to llama-server: (first token, done) in seconds since t0, tokens."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(endpoint)
    body = json.dumps({
        "model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.0, "max_tokens": max_tokens,
    })
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    conn.request("POST", u.path + "/chat/completions", body, {"Content-Type": "application/json", "Accept": "text/event-stream"})
    resp = conn.getresponse()
    first, tokens = None, 0
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        event = json.loads(line[5:])
        if first is None and any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
            first = time.perf_counter() - t0
        if event.get("usage"):
            tokens = event["usage"].get("completion_tokens", tokens)
    conn.close()
    done = time.perf_counter() - t0
    return (first if first is not None else done), done, tokens


async def _at_once(ask: Callable[[str, float], Any], n: int) -> dict[str, float]:
    """One caller alone, `n` at once, one alone again: aggregate tokens/s of the n against the
    mean of the two alone (so that a load change around them weighs on both sides), and the
    last of the n callers' time to first token. `ask(prompt, t0)` -> (first token s, done s, tokens)."""
    async def one() -> tuple[float, float]:
        t0 = time.perf_counter()
        first, done, tokens = await ask(CONCURRENT_PROMPTS[0], t0)
        return first, tokens / done

    first, before = await one()
    t0 = time.perf_counter()
    together = await asyncio.gather(*(ask(CONCURRENT_PROMPTS[i % len(CONCURRENT_PROMPTS)], t0) for i in range(n)))
    wall = max(done for _, done, _ in together)
    _, after = await one()
    alone = (before + after) / 2
    aggregate = sum(t for _, _, t in together) / wall
    return {"alone_tps": alone, "together_tps": aggregate, "ratio": aggregate / alone,
            "last_first_token_s": max(f for f, _, _ in together), "alone_first_token_s": first}


async def real_concurrency(repeats: int, callers: int = 4) -> dict[str, Any]:
    from wisp_shim.localmodel import local_model

    try:
        binary, gguf = local_model.find_server(), local_model.find_model()
    except local_model.LocalModelError as exc:
        binary, gguf, why = None, None, str(exc)
    else:
        why = "no llama.cpp server" if binary is None else "no SmolLM2 GGUF" if gguf is None else ""
    if binary is None or gguf is None:
        reason = f"the local model is not installed ({why}; `make local-model` installs it)"
        log(f"real_concurrency: skipped: {reason}")
        return {"real_concurrency_throughput_ratio": None, "real_concurrency_reason": reason}

    # The slots wisp gives it by default (--max-threads 32).
    slots = local_model.slot_count(32, local_model.DEFAULT_CONTEXT, local_model.kv_bytes_per_token(gguf), local_model.physical_memory(), os.cpu_count())
    out: dict[str, Any] = {"real_concurrency_slots": slots}
    runs: dict[str, list[dict[str, float]]] = {"wisp": [], "direct": [], "direct_np1": []}

    def direct(lm: Any) -> Callable[[str, float], Any]:
        async def ask(prompt: str, t0: float) -> tuple[float, float, int]:
            return await asyncio.to_thread(_direct_stream, lm.endpoint, lm.alias, prompt, CONCURRENT_TOKENS, t0)
        return ask

    lm = local_model.LocalModel.of(binary, gguf, api_key="", slots=slots)
    await lm.ensure_running()
    try:
        async with mcp_client(wisp_argv("--endpoint", lm.endpoint, "--model", lm.alias, backend="openai")) as wisp:
            async def through_wisp(prompt: str, t0: float) -> tuple[float, float, int]:
                first: list[float] = []

                async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                    # The first written token; earlier notifications say what the call waits for.
                    if not first and (message or "").startswith("writing:"):
                        first.append(time.perf_counter() - t0)

                res = await wisp.call_tool("respond", {"prompt": prompt, "temperature": 0.0, "max_output_tokens": CONCURRENT_TOKENS},
                                           progress_callback=on_progress)
                done = time.perf_counter() - t0
                assert not res.is_error, res
                sc = res.structured_content
                await wisp.call_tool("close_thread", {"thread_id": sc["thread_id"]})
                return (first[0] if first else done), done, _output_tokens(sc)

            await _at_once(through_wisp, callers)  # warm: model pages, every slot, the core's connections
            for r in range(repeats):
                for name, ask in ((("wisp", through_wisp), ("direct", direct(lm))) if r % 2 == 0 else (("direct", direct(lm)), ("wisp", through_wisp))):
                    runs[name].append(await _at_once(ask, callers))
                    x = runs[name][-1]
                    log(f"real_concurrency {r + 1}/{repeats} {name}: {callers} at once {x['together_tps']:.1f} tok/s, alone "
                        f"{x['alone_tps']:.1f} tok/s ({x['ratio']:.2f}x), last first token {x['last_first_token_s']:.2f} s")
    finally:
        lm.stop()
    one = local_model.LocalModel.of(binary, gguf, api_key="", slots=1)  # the old default, for comparison
    await one.ensure_running()
    try:
        await _at_once(direct(one), callers)
        for r in range(repeats):
            runs["direct_np1"].append(await _at_once(direct(one), callers))
            x = runs["direct_np1"][-1]
            log(f"real_concurrency {r + 1}/{repeats} direct -np 1: {x['together_tps']:.1f} tok/s vs {x['alone_tps']:.1f} ({x['ratio']:.2f}x), "
                f"last first token {x['last_first_token_s']:.2f} s")
    finally:
        one.stop()
    for name, prefix in (("wisp", "real_concurrency"), ("direct", "real_concurrency_direct"), ("direct_np1", "real_concurrency_direct_np1")):
        xs = runs[name]
        out[f"{prefix}_throughput_ratio"] = median([x["ratio"] for x in xs])
        out[f"{prefix}_tokens_per_s_{callers}"] = median([x["together_tps"] for x in xs])
        out[f"{prefix}_tokens_per_s_1"] = median([x["alone_tps"] for x in xs])
        out[f"{prefix}_last_first_token_ms"] = 1000 * median([x["last_first_token_s"] for x in xs])
    # The gain four threads get through wisp, as a share of the gain the same requests get sent
    # straight to the same server (its slots): what wisp loses of the server's parallelism.
    out["real_concurrency_gain_vs_direct"] = out["real_concurrency_throughput_ratio"] / out["real_concurrency_direct_throughput_ratio"]
    out["real_concurrency_model"] = (f"{lm.alias} ({gguf.name}), {callers} threads x {CONCURRENT_TOKENS} max tokens at once vs one, "
                                     f"temperature 0, {slots} slots x {local_model.DEFAULT_CONTEXT} tokens")
    out["_runs"] = {"real_concurrency": runs}
    return out


# --- the run ------------------------------------------------------------------------------


# --- durable ------------------------------------------------------------------------------


async def durable(calls: int, repeats: int, resume_repeats: int) -> dict[str, Any]:
    import shutil
    import tempfile

    parent = os.environ.get("WISP_BENCH_STATE_PARENT") or str(REPO / "bench")
    runs = []
    resumes: list[dict[str, float]] = []
    state = tempfile.mkdtemp(prefix=".durable-state-", dir=parent)
    try:
        for r in range(repeats):
            async with mcp_client(wisp_argv()) as memory_, mcp_client(wisp_argv("--state-dir", state)) as stored:
                clients = {"memory": memory_, "durable": stored}
                times: dict[str, list[float]] = {k: [] for k in clients}
                for i in range(calls + 20):
                    for name in (list(clients) if i % 2 else list(clients)[::-1]):
                        # A new thread every 50 turns: its first turn writes a whole file, the others append.
                        args = {"prompt": f"ping {i}", "thread_id": f"{name}-{r}-{i // 50}"}
                        t = time.perf_counter()
                        res = await clients[name].call_tool("respond", args)
                        if i >= 20:
                            times[name].append(time.perf_counter() - t)
                        assert not res.is_error, res
            run = {f"{k}_p50_us": pct(v, 0.5) * 1e6 for k, v in times.items()}
            run["ratio_p50"] = run["durable_p50_us"] / run["memory_p50_us"]
            runs.append(run)
            log(f"durable {r + 1}/{repeats}: p50 in memory {run['memory_p50_us']:.0f} us, durable {run['durable_p50_us']:.0f} us, ratio {run['ratio_p50']:.2f}")
        turn = "x" * 1000
        for r in range(resume_repeats):
            async with mcp_client(wisp_argv("--state-dir", state)) as c:
                for i in range(50):
                    assert not (await c.call_tool("respond", {"prompt": f"{i} {turn}", "thread_id": f"resume-{r}"})).is_error
            async with mcp_client(wisp_argv("--state-dir", state)) as c:
                await c.call_tool("respond", {"prompt": "warm", "thread_id": f"warm-{r}"})
                t = time.perf_counter()
                res = await c.call_tool("respond", {"prompt": "resume", "thread_id": f"resume-{r}"})
                resume = time.perf_counter() - t
                assert res.structured_content["turns"] == 51 and not res.structured_content["created"], res
                t = time.perf_counter()
                await c.call_tool("respond", {"prompt": "next", "thread_id": f"resume-{r}"})
                after = time.perf_counter() - t
            resumes.append({"resume_ms": resume * 1e3, "next_call_ms": after * 1e3})
            log(f"resume {r + 1}/{resume_repeats}: 50-turn thread of 1 KB prompts resumed in {resume * 1e3:.2f} ms (next call {after * 1e3:.2f} ms)")
        # list_threads over 1,000 stored threads (none live: a restarted wisp), a fresh state dir.
        shutil.rmtree(state, ignore_errors=True)
        async with mcp_client(wisp_argv("--state-dir", state, "--max-stored-threads", "1000")) as c:
            for i in range(1000):
                assert not (await c.call_tool("respond", {"prompt": f"thread {i}", "thread_id": f"list-{i}"})).is_error
        lists: list[float] = []
        pages: list[float] = []

        async def listing(args: dict) -> dict:
            res = await c.call_tool("list_threads", args)
            assert not res.is_error, res
            return res.structured_content

        async with mcp_client(wisp_argv("--state-dir", state)) as c:
            for r in range(resume_repeats + 1):
                # One page as a caller first sees it (the default 20), then every thread, 100 a page.
                t = time.perf_counter()
                first = await listing({})
                page = time.perf_counter() - t
                t = time.perf_counter()
                threads, walked = await all_threads(listing)
                if r:  # the first warms the page cache
                    pages.append(page * 1e3)
                    lists.append((time.perf_counter() - t) * 1e3)
                assert len(first["threads"]) == 20 and first.get("next_cursor"), first
                assert len({x["thread_id"] for x in threads}) == 1000 and walked == 10, (len(threads), walked)
        log(f"list_threads over 1000 stored threads: first page {median(pages):.2f} ms, "
            f"all 10 pages {median(lists):.2f} ms")
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return {
        "durable_turn_ratio": median([x["ratio_p50"] for x in runs]),
        "durable_turn_p50_us": median([x["durable_p50_us"] for x in runs]),
        "durable_memory_turn_p50_us": median([x["memory_p50_us"] for x in runs]),
        "durable_resume_50_turns_ms": median([x["resume_ms"] for x in resumes]),
        "durable_resume_next_call_ms": median([x["next_call_ms"] for x in resumes]),
        "durable_list_1000_ms": median(lists),
        "durable_list_1000_page_ms": median(pages),
        "_runs": {"durable": runs, "durable_resume": resumes},
    }


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem_gb = round(kb / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": cpu, "cpus": os.cpu_count(), "memory_gb": mem_gb, "os": platform.platform(),
        "python": platform.python_version(), "loadavg_start": os.getloadavg(),
    }


def verdict(key: str, value: Any) -> str:
    if key not in TARGETS:
        return ""
    target, kind = TARGETS[key]
    if value is None:
        return "n/a"
    ok = value <= target if kind == "max" else value >= target
    return "ok" if ok else "MISSED"


ROWS = [
    ("roundtrip_ratio_p50", "respond round trip, wisp / bare SDK server (p50)", "{:.2f}"),
    ("roundtrip_wisp_p50_us", "  wisp p50 / p99 (us)", None),
    ("roundtrip_baseline_p50_us", "  baseline p50 / p99 (us)", None),
    ("roundtrip_ratio_p50_same_transport", "  wisp / baseline on wisp's stdio transport", "{:.2f}"),
    ("roundtrip_added_p50_us_same_transport", "  wisp - baseline on wisp's transport (us)", "{:.0f}"),
    ("pipe_p50_us", "shim <-> core round trip p50 (us)", "{:.0f}"),
    ("pipe_idle_p50_us", "  the same, 2 ms idle between calls (us)", "{:.0f}"),
    ("concurrency_ratio", "32 threads x !sleep 500 / one call", "{:.3f}"),
    ("concurrency_ratio_baseline", "  the same, bare SDK server (asyncio sleep)", "{:.3f}"),
    ("serial_ratio", "8 calls on one thread / (8 x one call)", "{:.3f}"),
    ("cold_start_ratio", "spawn -> tools/list, wisp / baseline", "{:.2f}"),
    ("cold_start_wisp_ms", "  wisp / baseline (ms)", None),
    ("rss_idle_mb", "RSS idle, shim + core (MB)", "{:.1f}"),
    ("rss_32x50_mb", "RSS, 32 threads x 50 turns of 1 KB (MB)", "{:.1f}"),
    ("rss_growth_10k_mb", "RSS growth over 10,000 create/close (MB)", "{:.2f}"),
    ("caller_bytes_ratio", "caller bytes, thread / resend history", "{:.3f}"),
    ("files_caller_bytes_ratio", "caller bytes, 40 KB file attached / pasted", "{:.4f}"),
    ("real_tokens_per_s_ratio", "tokens/s through wisp / direct", "{:.3f}"),
    ("schema_valid_rate", "schema calls whose value validates", "{:.2f}"),
    ("schema_latency_ratio", "call time with a schema / without", "{:.2f}"),
    ("durable_turn_ratio", "durable turn / in-memory turn (p50)", "{:.2f}"),
    ("durable_turn_p50_us", "  durable / in memory p50 (us)", None),
    ("durable_resume_50_turns_ms", "resume a stored 50-turn thread (ms)", "{:.2f}"),
    ("durable_list_1000_ms", "list_threads, all 1,000 stored threads (ms)", "{:.2f}"),
    ("durable_list_1000_page_ms", "  its first page of 20 (ms)", "{:.2f}"),
    ("real_concurrency_throughput_ratio", "tokens/s, 4 threads at once / one alone", "{:.2f}"),
    ("real_concurrency_gain_vs_direct", "  that gain / the same sent straight to the server", "{:.2f}"),
    ("real_concurrency_last_first_token_ms", "  last of 4 callers' first token (ms)", "{:.0f}"),
    ("real_concurrency_direct_throughput_ratio", "  direct to llama-server, wisp's slots", "{:.2f}"),
    ("real_concurrency_direct_np1_throughput_ratio", "  direct to llama-server, -np 1", "{:.2f}"),
    ("real_concurrency_direct_np1_last_first_token_ms", "  -np 1: last caller's first token (ms)", "{:.0f}"),
    ("real_turn_ttft_ratio_20", "TTFT turn 20 / turn 1, one thread", "{:.2f}"),
    ("real_turn_ttft_ratio_20_resend", "  turn 20 resent whole (no thread) / turn 1", "{:.2f}"),
    ("real_turn_evaluated_tokens_20", "  prompt tokens evaluated, turn 20 / resent", None),
    ("real_turn_ttft_ratio_condensed", "TTFT after condensing / turn 1, one thread", "{:.2f}"),
    ("real_turn_evaluated_tokens_condensed", "  prompt tokens evaluated, condensed turn", "{:.0f}"),
    ("real_turn_ttft_ratio_20_interleaved", "TTFT turn 20 / turn 1, 8 threads on 8 slots", "{:.2f}"),
    ("real_turn_ttft_ratio_condensed_interleaved", "TTFT condensed / turn 1, 8 on 8 slots", "{:.2f}"),
    ("real_turn_ttft_ratio_8_12_threads_8_slots", "TTFT turn 8 / turn 1, 12 threads on 8 slots", "{:.2f}"),
    ("real_turn_ttft_ratio_8_12_threads_8_slots_evaluated_tokens", "  prompt tokens evaluated a turn", "{:.0f}"),
    ("condensed_turn_tokens_ratio_no_reuse", "tokens evaluated a condensed turn / its own, no KV shift", "{:.2f}"),
    ("condensed_turn_tokens_ratio_no_reuse_history_turns", "  turns the history held meanwhile", "{:.1f}"),
    ("real_turn_ttft_ratio_resumed", "first turn back after a wisp restart / turn 1", "{:.2f}"),
    ("real_turn_ttft_ratio_resumed_slot_taken", "  the same, its slot taken by another thread", "{:.2f}"),
    ("real_turn_ttft_ratio_server_restarted", "  after a llama-server restart too", "{:.2f}"),
]


def table(res: dict[str, Any]) -> str:
    lines = [f"{'metric':<44} {'value':>17} {'target':>8}  verdict", "-" * 80]
    for key, label, fmt in ROWS:
        if key not in res:
            continue
        v = res[key]
        if key == "roundtrip_wisp_p50_us":
            shown = f"{v:.0f} / {res['roundtrip_wisp_p99_us']:.0f}"
        elif key == "roundtrip_baseline_p50_us":
            shown = f"{v:.0f} / {res['roundtrip_baseline_p99_us']:.0f}"
        elif key == "cold_start_wisp_ms":
            shown = f"{v:.0f} / {res['cold_start_baseline_ms']:.0f}"
        elif key == "durable_turn_p50_us":
            shown = f"{v:.0f} / {res['durable_memory_turn_p50_us']:.0f}"
        elif key == "real_turn_evaluated_tokens_20":
            shown = f"{v} / {res.get('real_turn_evaluated_tokens_20_resend')}"
        elif key == "pipe_p50_us":
            shown = f"{v:.0f} (p99 {res['pipe_p99_us']:.0f})"
        elif v is None:
            shown = "null"
        else:
            shown = fmt.format(v)
        if key in TARGETS:
            t, kind = TARGETS[key]
            target = f"{'<=' if kind == 'max' else '>='} {t:g}"
        else:
            target = ""
        lines.append(f"{label:<44} {shown:>17} {target:>8}  {verdict(key, v)}")
    if res.get("real_tokens_per_s_ratio") is None and res.get("real_tokens_per_s_reason"):
        lines.append(f"  (tokens/s: {res['real_tokens_per_s_reason']})")
    if res.get("schema_valid_rate") is None and res.get("schema_reason"):
        lines.append(f"  (schema: {res['schema_reason']})")
    if res.get("real_concurrency_throughput_ratio") is None and res.get("real_concurrency_reason"):
        lines.append(f"  (4 threads at once: {res['real_concurrency_reason']})")
    if res.get("precount_error_tokens_max") is None and res.get("precount_reason"):
        lines.append(f"  (pre-count: {res['precount_reason']})")
    if res.get("wheel_reason"):
        lines.append(f"  (wheel: {res['wheel_reason']})")
    if res.get("fleet_follow_up_ratio") is None and res.get("fleet_follow_up_reason"):
        lines.append(f"  (fleet follow-up: {res['fleet_follow_up_reason']})")
    if res.get("long_reason"):
        lines.append(f"  (long threads: {res['long_reason']})")
    return "\n".join(lines)


SECTIONS = ("roundtrip", "pipe", "concurrency", "cold_start", "memory", "bytes", "tokens", "real_concurrency", "schema", "durable",
            "long", "long_interleaved", "long_12on8", "long_resume", "long_no_reuse")


async def _long(section: Callable[[bool], Any], quick: bool) -> dict[str, Any]:
    found = long_threads._local()
    if isinstance(found, str):
        log(f"long threads: skipped: {found}")
        return {"long_reason": found}
    return await section(quick)

# Sections declared in modules of their own: each one's targets, report rows and run (given --quick):
# the shared server, a progress token's cost, fork and search, the pre-count, the local model's start,
# the installed wheel, threads in PostgreSQL, several model servers.
from fleet_bench import FLEET_ROWS, FLEET_TARGETS, fleet_section  # noqa: E402
from http_bench import HTTP_ROWS, HTTP_TARGETS, http_section  # noqa: E402
from local_server_bench import FIRST_ANSWER_ROWS, FIRST_ANSWER_TARGETS, first_answer  # noqa: E402
from pg_bench import POSTGRES_ROWS, POSTGRES_TARGETS, postgres_section  # noqa: E402
from precount_bench import PRECOUNT_ROWS, PRECOUNT_TARGETS, precount_section  # noqa: E402
from progress_bench import PROGRESS_ROWS, PROGRESS_TARGETS, progress_section  # noqa: E402
from threadops_bench import THREADOPS_ROWS, THREADOPS_TARGETS, threadops_section  # noqa: E402
from wheel_bench import WHEEL_ROWS, WHEEL_TARGETS, wheel_section  # noqa: E402

OWN_SECTIONS = {"threadops": (THREADOPS_TARGETS, THREADOPS_ROWS, threadops_section),
    "http": (HTTP_TARGETS, HTTP_ROWS, http_section), "progress": (PROGRESS_TARGETS, PROGRESS_ROWS, progress_section),
    "precount": (PRECOUNT_TARGETS, PRECOUNT_ROWS, lambda q: precount_section(q, _local_model())),
    "first_answer": (FIRST_ANSWER_TARGETS, FIRST_ANSWER_ROWS, lambda q: first_answer(repeats=1 if q else 3)),
    "wheel": (WHEEL_TARGETS, WHEEL_ROWS, wheel_section),
    "postgres": (POSTGRES_TARGETS, POSTGRES_ROWS, postgres_section),
    "fleet": (FLEET_TARGETS, FLEET_ROWS, lambda q: fleet_section(q, _local_model()))}
TARGETS.update({k: t for targets, _, _ in OWN_SECTIONS.values() for k, t in targets.items()})
ROWS += [row for _, rows, _ in OWN_SECTIONS.values() for row in rows]
SECTIONS += tuple(OWN_SECTIONS)


async def run_all(ns: argparse.Namespace) -> dict[str, Any]:
    q = ns.quick
    plan: dict[str, Callable[[], Any]] = {
        "roundtrip": lambda: roundtrip(calls=100 if q else 400, repeats=2 if q else 5),
        "pipe": lambda: pipe(calls=500 if q else 3000, repeats=2 if q else 5),
        "concurrency": lambda: concurrency(repeats=1 if q else 5),
        "cold_start": lambda: cold_start(repeats=3 if q else 9),
        "memory": lambda: memory(repeats=1 if q else 3, cycles=1000 if q else 10_000, growth_repeats=1 if q else 3),
        "bytes": caller_bytes,
        "tokens": lambda: real_tokens(repeats=2 if q else 6),
        "schema": lambda: schema_output(calls=4 if q else 20),
        "durable": lambda: durable(calls=100 if q else 300, repeats=2 if q else 5, resume_repeats=2 if q else 5),
        "real_concurrency": lambda: real_concurrency(repeats=1 if q else 5),
        "long": lambda: _long(long_threads.single, q),
        "long_interleaved": lambda: _long(long_threads.interleaved, q),
        "long_12on8": lambda: _long(long_threads.over_slots, q),
        "long_resume": lambda: _long(long_threads.resume, q),
        "long_no_reuse": lambda: _long(long_threads.no_reuse, q),
    }
    plan.update({name: (lambda run=run: run(q)) for name, (_, _, run) in OWN_SECTIONS.items()})
    results: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for name in SECTIONS:
        if ns.only and name not in ns.only:
            continue
        t = time.perf_counter()
        out = await plan[name]()
        runs.update(out.pop("_runs", {}))
        results.update(out)
        log(f"{name} done in {time.perf_counter() - t:.1f} s")
    results["_runs"] = runs
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few iterations: for developing the benchmark, not for figures")
    ap.add_argument("--only", nargs="*", choices=SECTIONS, help="run only these sections")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "latest.json"))
    ns = ap.parse_args()
    if not CORE.is_file():
        print(f"bench: {CORE} not found: run `make build` first", file=sys.stderr)
        return 1
    info = machine()
    log(f"{info['cpus']} x {info['cpu']}, load {info['loadavg_start']}")
    started = time.perf_counter()
    # The shim's own event loop (it polls for the core's reply before sleeping): the pipe
    # section drives the shim's core client in-process, and must see what the shim sees.
    from wisp_shim.loop import WispEventLoop
    with asyncio.Runner(loop_factory=WispEventLoop) as runner:
        res = runner.run(run_all(ns))
    runs = res.pop("_runs")
    info["loadavg_end"] = os.getloadavg()
    doc = {
        **res,
        "targets": {k: {"target": t, "kind": kind, "verdict": verdict(k, res.get(k))} for k, (t, kind) in TARGETS.items() if k in res},
        "machine": info,
        "quick": bool(ns.quick),
        "seconds": round(time.perf_counter() - started, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
    }
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(table(res))
    print(f"\n{info['cpus']} CPUs ({info['cpu']}), load {info['loadavg_start'][0]:.2f} -> {info['loadavg_end'][0]:.2f}; "
          f"{doc['seconds']:.0f} s; written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
