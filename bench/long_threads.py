"""Long threads on the local model (bench/run.py sections `long`, `long_interleaved`,
`long_12on8`, `long_resume`): what a turn costs the model as a thread grows, before and after
its history fills the context.

Every turn is a ~300-token prompt (distinct words, so that nothing but the thread's own
history can be cached) with a 4-token reply, at temperature 0, through wisp (shim + core)
against llama-server with SmolLM2 and 8 slots, as wisp starts it on a 2-core machine. Wisp talks
to the server through a recording proxy (tests/python/openai_stub.py) that keeps, for every chat
request, the slot it named (`id_slot`) and llama-server's `timings` (`prompt_n`: prompt tokens
evaluated; `cache_n`: taken from the slot's KV cache). Time to first token (TTFT) is the first
progress notification the MCP client gets of the reply being written ("writing: …").

- `long`: one thread. Within the context (8192 tokens a slot, so 20 turns fit): TTFT of turn 20
  / turn 1, and beside it the same 20th turn resent whole (a new thread whose prompt carries
  the 19 turns before it as text, as a caller without threads would send it). Past the context
  (4096): the median TTFT of the first 10 condensed turns / turn 1.
- `long_interleaved`: the same two with 8 threads on the 8 slots, round-robin (median over the
  threads of each thread's ratio).
- `long_12on8`: 12 threads on 8 slots, round-robin, within the context: 4 threads more than
  slots, so every turn takes the slot of the least recently used thread. No target: the ratio,
  the prompt tokens evaluated per turn (against `long_interleaved`'s), and llama-server's memory
  (it keeps a displaced slot's cache in RAM, `--cache-ram`, and restores it).
- `long_no_reuse`: one thread on one slot, 40 turns past the context (4096), with no slot named
  (`WISP_SLOTS=0`), so llama-server shifts nothing (no `n_cache_reuse`) and reuses only an
  unchanged prefix: the stand-in for vLLM, Ollama and LM Studio, where wisp condenses in steps
  (`WISP_CONDENSE_TO`). `condensed_turn_tokens_ratio_no_reuse`: the prompt tokens evaluated a
  turn over the last 20 of those 40, ÷ a turn's own new tokens (the median evaluated while the
  thread still fit); beside it the turns the history held, for each mark measured.
- `long_resume`: two durable threads (`--state-dir`), then wisp restarted against the same
  llama-server (a new core knows no slots), then llama-server restarted too: the TTFT of each
  thread's first turn back / its turn 1, with the tokens it evaluated.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from clients import REPO, log, mcp_client, median, rss_kb, wisp_argv

sys.path.insert(0, str(REPO / "tests" / "python"))
from openai_stub import RecordingProxy  # noqa: E402

SLOTS = 8
WITHIN = 8192      # per slot: 20 turns of ~300 tokens fit
CONDENSING = 4096  # per slot: wisp's default, filled after ~13 turns
WORDS = ("apple river stone cloud pencil garden window silver forest candle mirror ocean violin desert "
         "rocket basket thunder meadow lantern copper harbor saddle ember quartz").split()
TURN_WORDS = 250   # ~300 tokens with the chat template
REPLY_TOKENS = 4
# WISP_CONDENSE_TO's default (CoreConfig.defaultCondenseTo): its key carries no suffix.
CONDENSE_TO_DEFAULT = 0.5


def note(thread: str, i: int) -> str:
    r = random.Random(f"{thread}-{i}")
    return f"Note {i} of {thread}: " + " ".join(r.choice(WORDS) for _ in range(TURN_WORDS)) + ". Reply with OK."


def _local() -> tuple[Path, Path] | str:
    from wisp_shim.localmodel import local_model

    try:
        binary, gguf = local_model.find_server(), local_model.find_model()
    except local_model.LocalModelError as exc:
        return str(exc)
    if binary is None or gguf is None:
        return "the local model is not installed (`make local-model` installs it)"
    return binary, gguf


@asynccontextmanager
async def server(context: int, slots: int = SLOTS):
    from wisp_shim.localmodel import local_model

    found = _local()
    assert not isinstance(found, str)
    lm = local_model.LocalModel.of(found[0], found[1], api_key="", context_size=context, slots=slots)
    await lm.ensure_running()
    try:
        yield lm
    finally:
        lm.stop()


@asynccontextmanager
async def through_wisp(lm: Any, *args: str, env: dict[str, str] | None = None):
    with RecordingProxy(lm.port) as proxy:
        async with mcp_client(wisp_argv("--endpoint", proxy.endpoint, "--model", lm.alias, *args, backend="openai"),
                              env=env) as c:
            yield c, proxy


async def turn(c: Any, proxy: RecordingProxy, thread: str, prompt: str) -> dict[str, Any]:
    """One call, sequential with every other: the proxy's last chat request is its answer."""
    first: list[float] = []
    t0 = time.perf_counter()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        # The first written token; the notifications before it say what the call waits for.
        if not first and (message or "").startswith("writing:"):
            first.append(time.perf_counter() - t0)

    res = await c.call_tool("respond", {"prompt": prompt, "thread_id": thread, "temperature": 0.0,
                                        "max_output_tokens": REPLY_TOKENS}, progress_callback=on_progress)
    done = time.perf_counter() - t0
    assert not res.is_error, res
    sc = res.structured_content
    rec = proxy.answered_chats()[-1]
    t = rec.timings or {}
    return {"thread": thread, "ttft_s": first[0] if first else done, "total_s": done, "slot": rec.body.get("id_slot"),
            "prompt_n": t.get("prompt_n"), "cache_n": t.get("cache_n"), "condensed": sc["condensed"],
            "turns": sc["turns"], "dropped": sc["dropped"], "text": sc["text"],
            "requests": sum(1 for r in proxy.requests if r.path.endswith("/chat/completions"))}


def _show(x: dict[str, Any], n: int) -> str:
    return (f"{x['thread']} turn {n}: ttft {x['ttft_s']:.2f} s, slot {x['slot']}, evaluated {x['prompt_n']} "
            f"(cached {x['cache_n']}), turns {x['turns']}{' condensed' if x['condensed'] else ''}")


async def _rounds(c: Any, proxy: RecordingProxy, threads: list[str], rounds: int,
                  until_condensed: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """Round-robin turns on `threads`: `rounds` rounds, or (until_condensed) until every thread
    has had that many condensed turns."""
    seen: dict[str, list[dict[str, Any]]] = {t: [] for t in threads}
    r = 0
    while True:
        if until_condensed is None and r >= rounds:
            break
        if until_condensed is not None and all(sum(x["condensed"] for x in v) >= until_condensed for v in seen.values()):
            break
        assert r < 60, "no thread condensed within 60 turns"
        for t in threads:
            x = await turn(c, proxy, t, note(t, r))
            seen[t].append(x)
            if len(threads) == 1 or t == threads[0]:
                log(f"long: {_show(x, r + 1)}")
        r += 1
    return seen


def _ratio_20(turns: list[dict[str, Any]]) -> float:
    return turns[19]["ttft_s"] / turns[0]["ttft_s"]


def _ratio_condensed(turns: list[dict[str, Any]]) -> float:
    after = [x["ttft_s"] for x in turns if x["condensed"]][:10]
    return statistics.median(after) / turns[0]["ttft_s"]


def _evaluated(turns: list[dict[str, Any]], condensed: bool | None = None) -> float | None:
    xs = [x["prompt_n"] for x in turns[1:] if x["prompt_n"] is not None and (condensed is None or x["condensed"] == condensed)]
    return median(xs)


def _history_kept(turns: list[dict[str, Any]]) -> float | None:
    """Turns the history held after each condensed turn (median)."""
    return median([x["turns"] for x in turns if x["condensed"]][:10])


def _compact(seen: dict[str, list[dict[str, Any]]]) -> dict[str, list[list[Any]]]:
    """Per thread, per turn: [ttft s, slot, prompt_n, cache_n, condensed, turns]."""
    return {t: [[round(x["ttft_s"], 3), x["slot"], x["prompt_n"], x["cache_n"], x["condensed"], x["turns"]] for x in v]
            for t, v in seen.items()}


async def single(quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    async with server(WITHIN) as lm, through_wisp(lm) as (c, proxy):
        seen = await _rounds(c, proxy, ["one"], 20)
        turns = seen["one"]
        out["real_turn_ttft_ratio_20"] = _ratio_20(turns)
        out["real_turn_ttft_20_ms"] = 1000 * turns[19]["ttft_s"]
        out["real_turn_ttft_1_ms"] = 1000 * turns[0]["ttft_s"]
        out["real_turn_evaluated_tokens_20"] = turns[19]["prompt_n"]
        # The caller without threads: the 19 turns before as text in one prompt, then the 20th.
        transcript = "\n\n".join(f"User: {note('one', i)}\nAssistant: {turns[i]['text']}" for i in range(19))
        resend = await turn(c, proxy, "resend", transcript + f"\n\nUser: {note('one', 19)}")
        log(f"long: {_show(resend, 20)} (resent whole)")
        out["real_turn_ttft_ratio_20_resend"] = resend["ttft_s"] / turns[0]["ttft_s"]
        out["real_turn_evaluated_tokens_20_resend"] = resend["prompt_n"]
        runs["one_within"] = _compact(seen)
        runs["one_resend"] = [round(resend["ttft_s"], 3), resend["slot"], resend["prompt_n"], resend["cache_n"]]
    async with server(CONDENSING) as lm, through_wisp(lm) as (c, proxy):
        seen = await _rounds(c, proxy, ["one"], 0, until_condensed=10)
        turns = seen["one"]
        out["real_turn_ttft_ratio_condensed"] = _ratio_condensed(turns)
        out["real_turn_evaluated_tokens_condensed"] = _evaluated(turns, condensed=True)
        out["real_turn_evaluated_tokens_before_condensing"] = _evaluated(turns, condensed=False)
        out["real_turn_history_turns_condensed"] = _history_kept(turns)
        out["real_turn_slots_used_condensed"] = len({x["slot"] for x in turns})
        runs["one_condensed"] = _compact(seen)
    out["real_turn_model"] = (f"SmolLM2-135M on llama-server, {SLOTS} slots, ~300-token turns, {REPLY_TOKENS}-token replies; "
                              f"within: {WITHIN} tokens a slot, condensed: {CONDENSING}")
    out["_runs"] = {"long": runs}
    return out


async def interleaved(quick: bool) -> dict[str, Any]:
    n = 3 if quick else SLOTS
    threads = [f"t{i}" for i in range(n)]
    out: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    async with server(WITHIN) as lm, through_wisp(lm) as (c, proxy):
        seen = await _rounds(c, proxy, threads, 20)
        out["real_turn_ttft_ratio_20_interleaved"] = median([_ratio_20(v) for v in seen.values()])
        out["real_turn_evaluated_tokens_20_interleaved"] = median([v[19]["prompt_n"] for v in seen.values()])
        out["real_turn_slot_changes_interleaved"] = sum(len({x["slot"] for x in v}) - 1 for v in seen.values())
        runs["within"] = _compact(seen)
    async with server(CONDENSING) as lm, through_wisp(lm) as (c, proxy):
        seen = await _rounds(c, proxy, threads, 0, until_condensed=10)
        out["real_turn_ttft_ratio_condensed_interleaved"] = median([_ratio_condensed(v) for v in seen.values()])
        out["real_turn_evaluated_tokens_condensed_interleaved"] = median([_evaluated(v, condensed=True) for v in seen.values()])
        out["real_turn_slot_changes_condensed_interleaved"] = sum(len({x["slot"] for x in v}) - 1 for v in seen.values())
        runs["condensed"] = _compact(seen)
    out["real_turn_interleaved_threads"] = n
    out["_runs"] = {"long_interleaved": runs}
    return out


async def over_slots(quick: bool) -> dict[str, Any]:
    """12 threads on 8 slots (4 on 2 when quick), within the context, round-robin."""
    slots, n, rounds = (2, 3, 4) if quick else (SLOTS, 12, 8)
    out: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for name, count in (("over", n),):
        async with server(CONDENSING, slots=slots) as lm, through_wisp(lm) as (c, proxy):
            rss_before = rss_kb(lm.proc.pid) if lm.proc else 0
            seen = await _rounds(c, proxy, [f"{name}{i}" for i in range(count)], rounds)
            rss_after = rss_kb(lm.proc.pid) if lm.proc else 0
            key = f"real_turn_ttft_ratio_{rounds}_{count}_threads_{slots}_slots"
            out[key] = median([v[rounds - 1]["ttft_s"] / v[0]["ttft_s"] for v in seen.values()])
            out[f"{key}_evaluated_tokens"] = median([_evaluated(v) for v in seen.values()])
            out[f"{key}_server_rss_growth_mb"] = (rss_after - rss_before) / 1024
            runs[name] = _compact(seen)
            log(f"long: {count} threads on {slots} slots: ratio {out[key]:.2f}, evaluated {out[f'{key}_evaluated_tokens']} a turn, "
                f"llama-server RSS +{out[f'{key}_server_rss_growth_mb']:.0f} MB")
    out["_runs"] = {"long_12on8": runs}
    return out


NO_REUSE_MARKS = (0.5, 0.75)


async def no_reuse(quick: bool, marks: tuple[float, ...] = NO_REUSE_MARKS) -> dict[str, Any]:
    past = 10 if quick else 40
    out: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for mark in marks:
        async with server(CONDENSING, slots=1) as lm, \
                through_wisp(lm, env={"WISP_SLOTS": "0", "WISP_CONDENSE_TO": str(mark)}) as (c, proxy):
            turns: list[dict[str, Any]] = []
            filled = None
            while filled is None or len(turns) < filled + past:
                assert len(turns) < 120, "the thread never condensed"
                x = await turn(c, proxy, "one", note("one", len(turns)))
                turns.append(x)
                if filled is None and x["condensed"]:
                    filled = len(turns) - 1
                log(f"long_no_reuse {mark}: {_show(x, len(turns))}")
        assert filled is not None
        own = median([x["prompt_n"] for x in turns[1:filled] if x["prompt_n"] is not None])
        last = turns[filled + past - 20:filled + past]
        ratio = statistics.mean(x["prompt_n"] for x in last) / own if own else None
        key = "condensed_turn_tokens_ratio_no_reuse" + ("" if mark == CONDENSE_TO_DEFAULT else f"_{mark:g}")
        out[key] = ratio
        out[f"{key}_history_turns"] = statistics.mean(x["turns"] for x in last)
        runs[str(mark)] = _compact({"one": turns})
    out["_runs"] = {"long_no_reuse": runs}
    return out


async def resume(quick: bool) -> dict[str, Any]:
    """Durable threads: the first turn back after wisp restarts (same llama-server), and after
    llama-server restarts too."""
    turns_each = 3 if quick else 6
    out: dict[str, Any] = {}
    seen: dict[str, list[dict[str, Any]]] = {}
    parent = REPO / "bench"
    with tempfile.TemporaryDirectory(prefix=".long-state-", dir=parent) as state:
        async with server(CONDENSING) as lm:
            async with through_wisp(lm, "--state-dir", state) as (c, proxy):
                seen = await _rounds(c, proxy, ["a", "b"], turns_each)
            # A new core: it knows no slots. "b" asks first and takes the first free slot, which
            # holds "a"'s turns; "a" then gets the next.
            async with through_wisp(lm, "--state-dir", state) as (c, proxy):
                for t in ("b", "a"):
                    x = await turn(c, proxy, t, note(t, turns_each))
                    assert x["turns"] == turns_each + 1, x
                    log(f"long: after a wisp restart, {_show(x, turns_each + 1)}")
                    seen[t].append(x)
            lm.stop()
            await lm.ensure_running()  # the server restarted: every slot's cache is gone
            async with through_wisp(lm, "--state-dir", state) as (c, proxy):
                x = await turn(c, proxy, "a", note("a", turns_each + 1))
                log(f"long: after a llama-server restart, {_show(x, turns_each + 2)}")
                seen["a"].append(x)
    a, b = seen["a"], seen["b"]
    out["real_turn_ttft_ratio_resumed_slot_taken"] = b[turns_each]["ttft_s"] / b[0]["ttft_s"]
    out["real_turn_evaluated_tokens_resumed_slot_taken"] = b[turns_each]["prompt_n"]
    out["real_turn_ttft_ratio_resumed"] = a[turns_each]["ttft_s"] / a[0]["ttft_s"]
    out["real_turn_evaluated_tokens_resumed"] = a[turns_each]["prompt_n"]
    out["real_turn_ttft_ratio_server_restarted"] = a[turns_each + 1]["ttft_s"] / a[0]["ttft_s"]
    out["real_turn_evaluated_tokens_server_restarted"] = a[turns_each + 1]["prompt_n"]
    out["real_turn_evaluated_tokens_before_restart"] = median([x["prompt_n"] for x in a[1:turns_each]])
    out["_runs"] = {"long_resume": _compact(seen)}
    return out
