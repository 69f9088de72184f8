"""`make bench`'s `fleet` section: several model servers behind one wisp (`--endpoint` repeated,
docs/backends.md "Several model servers").

  fleet_spread           32 new threads on 3 scripted OpenAI-compatible servers
                         (tests/python/openai_stub.py): pinned threads on the busiest endpoint /
                         on the least busy, each thread's endpoint read from its result's
                         `usage.endpoint`; median over repeats, each with new servers (new
                         ports: new endpoint names to hash) and new thread ids; the worst beside it
  fleet_follow_up_ratio  the same follow-up turn on the thread's own endpoint / after a move, on
                         two llama-servers with the bundled model (when installed): threads pinned
                         to the first get a long turn, then the follow-up (timed); the first server
                         is killed, and the same follow-up (`rewind: 1`, the same prompt) moves to
                         the second, which reads the whole thread again (timed); then the same once
                         more there, its own endpoint now (timed; its prompt is cached too). Call
                         times, medians over threads and repeats
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from openai_stub import OpenAIStub  # noqa: E402

from clients import log, mcp_client, median, wisp_argv  # noqa: E402

FLEET_TARGETS = {
    "fleet_spread": (1.5, "max"),
}
FLEET_ROWS = [
    ("fleet_spread", "pinned threads, busiest / least busy (32 on 3)", "{:.2f}"),
    ("fleet_spread_worst", "  the worst of the repeats", "{:.2f}"),
    ("fleet_follow_up_ratio", "follow-up turn, own endpoint / after a move", "{:.2f}"),
    ("fleet_follow_up_own_ms", "  on its own endpoint (ms)", "{:.0f}"),
    ("fleet_follow_up_moved_ms", "  after the move: the thread read again (ms)", "{:.0f}"),
    ("fleet_follow_up_settled_ms", "  the same again there, its own now (ms)", "{:.0f}"),
    ("fleet_follow_up_history_tokens", "  prompt tokens of the turn before it", "{:.0f}"),
]

# Long enough that reading the thread again is most of a turn on a small CPU; under a quarter of
# the local model's per-thread window (4096 tokens) with its answer.
_DOC = ("Release notes, build {n}. The scheduler now keeps each conversation on one worker while "
        "that worker is healthy; a worker that refuses a connection is retried after a pause that "
        "doubles up to a minute. Caches are per worker, so a conversation that moves is read again "
        "from its first message. Metrics list pinned conversations per worker. ")
FOLLOW_UP = "In one short sentence: what happens to a conversation that moves?"


def _endpoint_flags(endpoints: list[str]) -> list[str]:
    return [x for e in endpoints for x in ("--endpoint", e)]


async def _spread_once(tag: str) -> dict[str, Any]:
    with OpenAIStub() as a, OpenAIStub() as b, OpenAIStub() as c:
        argv = wisp_argv(*_endpoint_flags([a.endpoint, b.endpoint, c.endpoint]), "--model", "stub-model",
                         "--max-threads", "64", backend="openai")
        async with mcp_client(argv) as wisp:
            counts = {f"127.0.0.1:{s.port}": 0 for s in (a, b, c)}
            for i in range(32):
                res = await wisp.call_tool("respond", {"prompt": "hello", "thread_id": f"{tag}-{i}"})
                assert not res.is_error, res
                counts[res.structured_content["usage"]["endpoint"]] += 1
    loads = sorted(counts.values())
    return {"loads": loads, "spread": loads[-1] / loads[0] if loads[0] else float("inf")}


async def _spread(repeats: int) -> dict[str, Any]:
    runs = [await _spread_once(f"spread{r}") for r in range(repeats)]
    log("fleet spread: " + ", ".join(f"{x['loads']} ({x['spread']:.2f})" for x in runs))
    return {"fleet_spread": median([x["spread"] for x in runs]), "fleet_spread_worst": max(x["spread"] for x in runs),
            "_runs": {"fleet_spread": runs}}


async def _call(wisp: Any, args: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    res = await wisp.call_tool("respond", {"temperature": 0.0, "max_output_tokens": 8, **args})
    took = time.perf_counter() - t
    assert not res.is_error, res
    return took, res.structured_content


async def _follow_up_once(binary: Any, gguf: Path, threads: int, tag: str) -> dict[str, Any]:
    from wisp_shim.localmodel import local_model

    # Slots for every thread on either server, so that no thread loses its cache to another's.
    first, second = (local_model.LocalModel.of(binary, gguf, api_key="", slots=2 * threads + 2) for _ in range(2))
    try:
        for lm in (first, second):
            await lm.ensure_running()
        home = f"127.0.0.1:{first.port}"
        argv = wisp_argv(*_endpoint_flags([first.endpoint, second.endpoint]), "--model", first.alias, backend="openai")
        async with mcp_client(argv) as wisp:
            mine: list[str] = []
            for i in range(8 * threads):  # a new thread goes to either; keep those on the first
                _, sc = await _call(wisp, {"prompt": "Hello.", "thread_id": f"{tag}-{i}"})
                if sc["usage"]["endpoint"] == home:
                    mine.append(sc["thread_id"])
                if len(mine) == threads:
                    break
            assert len(mine) == threads, f"only {len(mine)} of {8 * threads} threads went to {home}"
            own: list[float] = []
            history: list[float] = []
            cached: dict[str, list[float]] = {"own": [], "moved": []}
            for n, tid in enumerate(mine):
                _, sc = await _call(wisp, {"prompt": _DOC.format(n=n) * 12 + "\nSay OK.", "thread_id": tid})
                history.append(float(sc["usage"].get("input_tokens") or 0))
                took, sc = await _call(wisp, {"prompt": FOLLOW_UP, "thread_id": tid})
                assert sc["usage"]["endpoint"] == home, sc
                own.append(took)
                cached["own"].append(float(sc["usage"].get("cached_tokens") or 0))
            first.stop()  # refused from now on: each thread's next turn moves
            moved: list[float] = []
            settled: list[float] = []
            for tid in mine:
                for into in (moved, settled):
                    took, sc = await _call(wisp, {"prompt": FOLLOW_UP, "thread_id": tid, "rewind": 1})
                    assert sc["usage"]["endpoint"] == f"127.0.0.1:{second.port}", sc
                    into.append(took)
                    if into is moved:
                        cached["moved"].append(float(sc["usage"].get("cached_tokens") or 0))
    finally:
        first.stop()
        second.stop()
    run = {"own_ms": [x * 1e3 for x in own], "moved_ms": [x * 1e3 for x in moved],
           "settled_ms": [x * 1e3 for x in settled], "history_tokens": median(history),
           "cached_tokens_own": median(cached["own"]), "cached_tokens_moved": median(cached["moved"])}
    run["ratio"] = (median(own) or 0) / (median(moved) or 1)
    log(f"fleet follow-up {tag}: own {median(run['own_ms']):.0f} ms, moved {median(run['moved_ms']):.0f} ms, "
        f"then {median(run['settled_ms']):.0f} ms; ratio {run['ratio']:.2f} ({run['history_tokens']:.0f} tokens read before)")
    return run


async def _follow_up(found: tuple[Any, Path] | str, threads: int, repeats: int) -> dict[str, Any]:
    if isinstance(found, str):
        log(f"fleet follow-up: skipped: {found}")
        return {"fleet_follow_up_ratio": None, "fleet_follow_up_reason": found}
    binary, gguf = found
    runs = [await _follow_up_once(binary, gguf, threads, f"follow{r}") for r in range(repeats)]

    def pooled(key: str) -> float | None:
        return median([x for run in runs for x in run[key]])

    own, moved = pooled("own_ms"), pooled("moved_ms")
    return {"fleet_follow_up_ratio": (own or 0) / (moved or 1), "fleet_follow_up_own_ms": own,
            "fleet_follow_up_moved_ms": moved, "fleet_follow_up_settled_ms": pooled("settled_ms"),
            "fleet_follow_up_history_tokens": median([run["history_tokens"] for run in runs]),
            "_runs": {"fleet_follow_up": runs}}


async def fleet_section(quick: bool, found: tuple[Any, Path] | str) -> dict[str, Any]:
    """`found`: the installed llama-server and GGUF, or why they are not (bench/run.py's `_local_model`)."""
    out = await _spread(repeats=3 if quick else 15)
    more = await _follow_up(found, threads=1 if quick else 4, repeats=1 if quick else 2)
    out["_runs"].update(more.pop("_runs", {}))
    return {**out, **more}
