"""The openai backend against a REAL model: llama.cpp's llama-server with SmolLM2-135M-Instruct
(`make local-model`), through a real MCP client, the shim and the core.

Prompts stay short (< 300 tokens), max_output_tokens <= 64 and temperature 0, so the whole
file runs in well under a minute on 2 cores. Content is asserted loosely (a 135M model);
structure is asserted exactly.

Skipped, with the reason, when the local model is not installed; WISP_REQUIRE_LOCAL_MODEL=1
(set by CI) turns that skip into a failure, so CI cannot pass without running them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import anyio
import pytest

from harness import error_text, ok, shim_env, wait_for, wait_until, wisp
from harness.real_model import FOUND, serve, skip_unless_installed, via
from openai_stub import RecordingProxy
from harness import grandchildren_named, ppid as _ppid, running as _alive
from wisp_shim.localmodel import llama_install, llama_server, local_model

SETTINGS = {"temperature": 0, "max_output_tokens": 32}

if (skip := skip_unless_installed()) is not None:
    pytestmark = skip

PARALLEL = 4


@pytest.fixture(scope="module")
def llama():
    # Several slots, as wisp starts it: each thread's context is a slot's, not the whole -c.
    lm = serve(local_model.DEFAULT_CONTEXT, slots=PARALLEL)
    yield lm
    lm.stop()


@pytest.fixture(scope="module")
def llama_small():
    lm = serve(512)
    yield lm
    lm.stop()


@pytest.fixture(scope="module")
def llama_long():
    # A context a few turns fill: a thread soon runs past it.
    lm = serve(LONG_CONTEXT, slots=2)
    yield lm
    lm.stop()


LONG_CONTEXT = 1024


# The default these tests mean: on a Mac whose Apple model can answer, `auto` picks that instead.
LOCAL = {"WISP_LOCAL_MODEL": "1"} if sys.platform == "darwin" else {}


def _our_llama_servers() -> set[int]:
    """llama-server processes started by a shim that this test process started
    (other test runs on the same machine may have their own)."""
    return grandchildren_named(os.getpid(), "llama-server", module=llama_install.LAUNCHER)


async def test_default_on_linux_is_the_local_model_and_leaves_no_orphan(llama):
    """What `make run` gives: no backend, no endpoint → wisp starts llama-server itself."""
    t0 = time.monotonic()
    async with wisp(backend=None, env=shim_env(**LOCAL)) as c:
        r = ok(await c.call_tool("respond", {"prompt": "What is the capital of France? Answer in one word.", **SETTINGS}))
        first_answer_s = time.monotonic() - t0
        assert "paris" in r["text"].lower(), r["text"]
        st = ok(await c.call_tool("list_threads", {}))
        assert (st["backend"], st["model"], st["available"], st["context_size"]) == ("openai", llama_server.MODEL_ALIAS, True, 4096)
        ours = _our_llama_servers()
        assert len(ours) == 1, "wisp should have started exactly one llama-server"
    print(f"\ncold start to first real answer through wisp: {first_answer_s:.2f} s")
    await wait_for(lambda: not any(map(_alive, ours)), 5, "llama-server outlived wisp")


async def test_second_call_carries_the_first_turn(llama):
    system = "You are a helpful assistant."
    fact = "Remember this: the secret word is mango."
    with RecordingProxy(llama.port, api_key=llama.api_key) as proxy:
        async with via(proxy) as c:
            s1 = ok(await c.call_tool("respond", {"prompt": fact, "instructions": system, **SETTINGS}))
            s2 = ok(await c.call_tool("respond", {"prompt": "What is the secret word?", "thread_id": s1["thread_id"], **SETTINGS}))
            # Control: a fresh thread asked the same does not know it.
            fresh = ok(await c.call_tool("respond", {"prompt": "What is the secret word?", "instructions": system, **SETTINGS}))
        chats = proxy.chats()
        assert len(chats) == 3
        assert chats[1]["messages"] == [
            {"role": "system", "content": system},
            {"role": "user", "content": fact},
            {"role": "assistant", "content": s1["text"]},
            {"role": "user", "content": "What is the secret word?"},
        ]
        assert chats[1]["temperature"] == 0 and chats[1]["max_tokens"] == SETTINGS["max_output_tokens"] and chats[1]["stream"] is True
        assert chats[2]["messages"] == [{"role": "system", "content": system}, {"role": "user", "content": "What is the secret word?"}]
        assert s2["turns"] == 2 and not s2["condensed"]
        assert "mango" in s2["text"].lower(), f"the model did not recall the word: {s2['text']!r}"
        assert "mango" not in fresh["text"].lower(), fresh["text"]


async def test_overflow_with_small_context_condenses_through_the_servers_error(llama_small):
    # /tokenize and the whole-request count hidden: no pre-flight count, so the drop must come from llama.cpp's own
    # HTTP 400 exceed_context_size_error, recognised and handed to the core's condensing.
    filler = "Here is a note about the weather today: it is mild, dry and calm with a light breeze. " * 5
    hide = ("/tokenize", "/v1/chat/completions/input_tokens")
    with RecordingProxy(llama_small.port, api_key=llama_small.api_key, hide=hide) as proxy:
        async with via(proxy) as c:
            assert ok(await c.call_tool("list_threads", {}))["context_size"] == 512  # read from /props
            tid, results = None, []
            for i in range(8):
                args = {"prompt": f"Note {i}. {filler} Reply with OK.", **SETTINGS}
                if tid:
                    args["thread_id"] = tid
                s = ok(await c.call_tool("respond", args))
                tid = s["thread_id"]
                results.append(s)
                if s["condensed"]:
                    break
        assert results[-1]["condensed"] is True, [r["turns"] for r in results]
        assert results[-1]["dropped"] >= 1 and results[-1]["turns"] < len(results)
        assert ("/v1/chat/completions", 400) in proxy.statuses  # the server really overflowed
        assert proxy.statuses[-1] == ("/v1/chat/completions", 200)  # and the retry fit


async def test_overflow_with_preflight_count_condenses(llama_small):
    filler = "The quick brown fox jumps over the lazy dog near the quiet river bank. " * 6
    with RecordingProxy(llama_small.port, api_key=llama_small.api_key) as proxy:
        async with via(proxy) as c:
            tid, condensed = None, False
            for i in range(8):
                args = {"prompt": f"Note {i}. {filler} Reply with OK.", **SETTINGS}
                if tid:
                    args["thread_id"] = tid
                s = ok(await c.call_tool("respond", args))
                tid, condensed = s["thread_id"], s["condensed"]
                if condensed:
                    break
        assert condensed
        assert any(r.path == "/tokenize" for r in proxy.requests)  # counted with the model's tokenizer


async def test_streaming_gives_progress(llama):
    seen: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, message))

    with RecordingProxy(llama.port, api_key=llama.api_key) as proxy:
        async with via(proxy) as c:
            r = ok(await c.call_tool("respond", {"prompt": "Write two sentences about the sea.", **SETTINGS},
                                     progress_callback=on_progress))
    assert len(seen) >= 2, seen
    progresses = [p for p, _ in seen]
    assert progresses == sorted(progresses) and progresses[-1] > progresses[0]
    written = [m.split(" characters: ", 1)[1] for _, m in seen if m and m.startswith("writing: ")]
    assert written and r["text"].startswith(" ".join(written[0].split()).rstrip("…")[:10])


async def test_cancel_mid_generation_frees_the_thread(llama):
    started = asyncio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        started.set()

    with RecordingProxy(llama.port, api_key=llama.api_key) as proxy:
        async with via(proxy) as c:
            tid = ok(await c.call_tool("respond", {"prompt": "Say hello.", **SETTINGS}))["thread_id"]
            long_call = {"prompt": "Count from 1 to 100, separated by commas.", "thread_id": tid,
                         "temperature": 0, "max_output_tokens": 64}
            async with anyio.create_task_group() as tg:
                async def call() -> None:
                    await c.call_tool("respond", long_call, progress_callback=on_progress)
                tg.start_soon(call)
                with anyio.fail_after(30):
                    await started.wait()  # generating now
                tg.cancel_scope.cancel()
            # The HTTP request was closed mid-stream, and llama-server's slot is free again.
            await wait_for(lambda: proxy.disconnects >= 1, 5, "the request to llama-server was not closed")
            assert proxy.disconnects == 1
            await wait_for(lambda: not _slot_busy(llama), 5, "llama-server's slot stayed busy")
            threads = ok(await c.call_tool("list_threads", {}))["threads"]
            assert [(t["thread_id"], t["turns"], t["pending"]) for t in threads] == [(tid, 1, 0)]
            s = ok(await c.call_tool("respond", {"prompt": "Say goodbye.", "thread_id": tid, **SETTINGS}))
            assert s["turns"] == 2
            users = [m["content"] for m in proxy.chats()[-1]["messages"] if m["role"] == "user"]
            assert users == ["Say hello.", "Say goodbye."]  # the cancelled turn left no trace


def _slot_busy(lm: local_model.LocalModel) -> bool:
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{lm.port}/slots", headers=lm.auth())
        with urllib.request.urlopen(req, timeout=2) as r:
            return any(s.get("is_processing") for s in json.load(r))
    except OSError:
        return False


async def test_local_server_down_is_a_clear_error(llama):
    # The same core and model name, but the server it was pointed at is gone.
    with RecordingProxy(llama.port, api_key=llama.api_key) as proxy:
        endpoint = proxy.endpoint
    async with wisp("--endpoint", endpoint, backend="openai", env=shim_env()) as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "hello", **SETTINGS}))
    assert msg.startswith("model_unavailable:") and endpoint in msg, msg


async def test_make_run_gives_a_real_answer(llama):
    """`make run` as an MCP client's command (what the README tells users to configure): on
    Linux it installs the local model if needed, builds, and serves a real model's answer."""
    from mcp import Client, StdioServerParameters, stdio_client

    from harness import REPO

    params = StdioServerParameters(command="make", args=["-s", "run"], cwd=str(REPO), env=shim_env(**LOCAL))
    with open(os.devnull, "w") as quiet:
        async with Client(stdio_client(params, errlog=quiet)) as c:
            r = ok(await c.call_tool("respond", {"prompt": "What is the capital of France? Answer in one word.", **SETTINGS}))
            assert "paris" in r["text"].lower(), r["text"]
            st = ok(await c.call_tool("list_threads", {}))
            assert (st["backend"], st["model"]) == ("openai", llama_server.MODEL_ALIAS)


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="PR_SET_PDEATHSIG is Linux-only: elsewhere a SIGKILLed shim cannot take its llama-server with it")
def test_local_server_dies_with_a_killed_shim(llama):
    """SIGKILL leaves the shim no chance to clean up: PR_SET_PDEATHSIG must take llama-server down."""
    import signal
    import subprocess
    import sys

    from harness import core_path

    shim = subprocess.Popen([sys.executable, "-m", "wisp_shim", "--core", core_path()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=shim_env())
    try:
        ours: set[int] = set()

        def started() -> bool:
            ours.update(p for p in _our_llama_servers() if _ppid(p) == shim.pid)
            return bool(ours)

        assert wait_until(started, 60), "the shim did not start llama-server"
    finally:
        shim.send_signal(signal.SIGKILL)
        shim.wait()
    assert wait_until(lambda: not any(map(_alive, ours)), 5), "llama-server outlived a SIGKILLed shim"


async def test_local_server_is_restarted_if_it_dies(llama):
    import signal

    async with wisp(backend=None, env=shim_env(**LOCAL)) as c:
        ok(await c.call_tool("respond", {"prompt": "Say hi.", **SETTINGS}))
        (first,) = _our_llama_servers()
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 90
        await wait_for(lambda: _our_llama_servers() - {first}, 90, "llama-server was not restarted")
        # Once it answers /health again, calls work as before (same port, same core).
        while time.monotonic() < deadline:
            r = await c.call_tool("respond", {"prompt": "What is the capital of France? Answer in one word.", **SETTINGS})
            if not r.is_error:
                break
            await asyncio.sleep(0.5)  # the poll's interval
        assert "paris" in ok(r)["text"].lower()


def _props(lm: local_model.LocalModel) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{lm.port}/props", headers=lm.auth())
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


async def test_every_slot_has_the_whole_per_thread_context(llama):
    props = _props(llama)
    assert (props["total_slots"], props["default_generation_settings"]["n_ctx"]) == (PARALLEL, local_model.DEFAULT_CONTEXT)
    with RecordingProxy(llama.port, api_key=llama.api_key) as proxy:
        async with via(proxy) as c:
            st = ok(await c.call_tool("list_threads", {}))
    assert st["context_size"] == local_model.DEFAULT_CONTEXT


def test_check_reports_the_per_thread_context_of_wisps_own_server():
    """--check starts the local model as wisp does (a slot per thread, -c = slots x 4096)."""
    import subprocess

    from harness import REPO, shim_command

    run = subprocess.run(shim_command("--check"), capture_output=True, text=True, timeout=180,
                         env=shim_env(**LOCAL), cwd=REPO, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "context size: 4096 tokens" in run.stdout, run.stdout
    slots = run.stderr.split(" -np ", 1)[1].split()[0] if " -np " in run.stderr else ""
    assert slots.isdigit() and int(slots) > 1, run.stderr  # several slots, each of 4096


async def test_threads_asking_at_once_are_answered_at_once(llama):
    """With a slot each, every caller gets its first token before any caller's answer is done
    (with one slot, the last waits for all the others to finish)."""
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    prompts = ["Write a short story about a lighthouse.", "Write a short story about a baker.",
               "Write a short story about a radio.", "Write a short story about a dog."]
    with RecordingProxy(llama.port, api_key=llama.api_key) as proxy:
        async with via(proxy) as c:
            async def ask(i: int) -> None:
                async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                    if (message or "").startswith("writing: "):  # not what it waits for: its first token
                        first.setdefault(i, time.monotonic())

                ok(await c.call_tool("respond", {"prompt": prompts[i], "temperature": 0, "max_output_tokens": 64},
                                     progress_callback=on_progress))
                done[i] = time.monotonic()

            async with anyio.create_task_group() as tg:
                for i in range(PARALLEL):
                    tg.start_soon(ask, i)
    assert sorted(first) == list(range(PARALLEL)), first
    assert max(first.values()) < min(done.values()), (first, done)


async def test_a_fact_in_an_attached_file_is_answered_from_the_file(llama, tmp_path):
    """`files` on the real model: wisp reads the file, the model gets it with the prompt, and
    the caller never sent its text."""
    (tmp_path / "notes.txt").write_text("Project notes\nThe release codename is Tangerine.\n")
    question = "According to notes.txt, what is the release codename? Answer in one word."
    with RecordingProxy(llama.port, api_key=llama.api_key) as proxy:
        async with via(proxy, "--root", str(tmp_path)) as c:
            r = ok(await c.call_tool("respond", {"prompt": question, "files": ["notes.txt"], **SETTINGS}))
            control = ok(await c.call_tool("respond", {"prompt": question, **SETTINGS}))
        sent = proxy.chats()[0]["messages"][-1]["content"]
    assert '<file path="notes.txt">' in sent and "Tangerine" in sent, sent
    assert "tangerine" in r["text"].lower(), f"the model did not answer from the file: {r['text']!r}"
    assert "tangerine" not in control["text"].lower(), control["text"]


_WORDS = ("apple river stone cloud pencil garden window silver forest candle mirror ocean violin desert "
          "rocket basket thunder meadow lantern copper").split()


def _note(i: int, words: int = 120) -> str:
    """A distinct prompt of about 140 tokens."""
    import random

    r = random.Random(i)
    return f"Note {i}: " + " ".join(r.choice(_WORDS) for _ in range(words)) + ". Reply with OK."


async def test_a_thread_past_the_context_keeps_answering_on_its_slot_from_its_cached_turns(llama_long):
    """Past the context, condensing drops the oldest whole turns (condensed: true) and the thread
    keeps answering; the turns that remain are still in its slot's KV cache (kept on one slot,
    shifted into place by --cache-reuse), so a turn after condensing evaluates about its own
    tokens, not the whole context. Read from llama-server's own `timings` in each answer."""
    results = []
    with RecordingProxy(llama_long.port, api_key=llama_long.api_key) as proxy:
        async with via(proxy) as c:
            other = ok(await c.call_tool("respond", {"prompt": "Say hello.", "max_output_tokens": 4, "temperature": 0}))
            tid = None
            for i in range(16):
                args = {"prompt": _note(i), "max_output_tokens": 4, "temperature": 0}
                if tid:
                    args["thread_id"] = tid
                s = ok(await c.call_tool("respond", args))
                tid = s["thread_id"]
                results.append(s)
                if sum(r["condensed"] for r in results) >= 3:
                    break
            ok(await c.call_tool("close_thread", {"thread_id": other["thread_id"]}))
        chats = proxy.answered_chats()
    condensed = [r for r in results if r["condensed"]]
    assert len(condensed) >= 3, [(r["turns"], r["condensed"]) for r in results]
    assert all(r["dropped"] >= 1 and r["turns"] < n + 1 for n, r in enumerate(results) if r["condensed"])
    mine = [r for r in chats if r.body["messages"][0]["content"].startswith("Note ")]
    assert {r.body.get("id_slot") for r in mine} == {mine[0].body["id_slot"]} != {chats[0].body.get("id_slot")}, \
        [r.body.get("id_slot") for r in chats]
    after = []
    for r in mine:
        users = [int(m["content"].split(":")[0].split()[1]) for m in r.body["messages"] if m["role"] == "user"]
        # Whole turns dropped, oldest first: what is sent is the thread's last turns, in order.
        assert users == list(range(users[0], users[0] + len(users))), users
        if users[0] > 0 and r.timings is not None:
            after.append(r.timings)
    assert len(after) >= 3, after
    for t in after:
        whole = t["cache_n"] + t["prompt_n"]
        assert whole > LONG_CONTEXT // 2, t  # the prompt was the full context's worth
        assert t["prompt_n"] < whole // 3, f"a turn after condensing evaluated {t['prompt_n']} of {whole} tokens: {t}"
    assert all(r["text"].strip() for r in results), [r["text"] for r in results]


async def test_usage_input_tokens_is_llama_servers_prompt_tokens(llama):
    with RecordingProxy(llama.port, api_key=llama.api_key) as proxy:
        async with via(proxy) as c:
            s1 = ok(await c.call_tool("respond", {"prompt": "Name a colour.", "instructions": "Answer in one word.", **SETTINGS}))
            s2 = ok(await c.call_tool("respond", {"prompt": "Another one.", "thread_id": s1["thread_id"], **SETTINGS}))
            listed = ok(await c.call_tool("list_threads", {}))["threads"]
        first, second = proxy.answered_chats()
    for s, chat in ((s1, first), (s2, second)):
        # The counts as llama-server reported them (usage also carries time to first token, speed, cached tokens).
        counted = {k: s["usage"].get(k) for k in ("input_tokens", "output_tokens")}
        assert counted == {"input_tokens": chat.usage["prompt_tokens"], "output_tokens": chat.usage["completion_tokens"]}
    total = next(t["usage"] for t in listed if t["thread_id"] == s1["thread_id"])
    counts = ("input_tokens", "output_tokens")
    assert {k: total.get(k) for k in counts} == {k: s1["usage"][k] + s2["usage"][k] for k in counts}


async def test_the_pre_count_is_within_a_token_of_prompt_tokens_on_20_prompts(llama):
    """The core's count of each request before it sends it (llama-server's input_tokens, read off
    the core's own request) against the prompt_tokens the chat reports, on bench/precount_bench.py's
    20 calls of mixed length (threads with history, with and without instructions)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import precount_bench

    samples = await precount_bench.measure(llama.port, llama_server.MODEL_ALIAS, api_key=llama.api_key)
    assert len(samples) == 20
    worst = precount_bench.summary(samples)["precount_error_tokens_max"]
    assert worst <= 1, [(s["new"], s["prompt_tokens"]) for s in samples]


# --- each kind of server, where it is installed ------------------------------------------------

def _kinds() -> list[tuple[str, local_model.ServerProgram | None, str]]:
    native = wheel = None
    with contextlib.suppress(local_model.LocalModelError):
        native = local_model.find_llama_server()
    wheel = local_model.find_xllamacpp()
    return [
        (local_model.NATIVE, native and local_model.ServerProgram(local_model.NATIVE, native),
         "no compiled llama-server here (`make local-model-native` builds one; about 15 min)"),
        (local_model.XLLAMACPP, wheel and local_model.ServerProgram(local_model.XLLAMACPP, wheel),
         "the xllamacpp wheel is not installed (`make local-model`)"),
    ]


@pytest.mark.parametrize("kind, server, missing", _kinds(), ids=[kind for kind, _, _ in _kinds()])
async def test_each_installed_server_decodes_answers_only_its_key_and_serves_wisp(kind, server, missing):
    """The compiled server and the wheel's, each where it is installed (the default picks one)."""
    if server is None:
        pytest.skip(missing)
    assert not isinstance(FOUND, str)
    lm = local_model.LocalModel.of(server, FOUND[1], context_size=1024)
    t0 = time.monotonic()
    try:
        await lm.ensure_running()
        assert await llama_server.decode(lm, timeout=120) is None
        ready_s = time.monotonic() - t0
        assert llama_server.refuses_unkeyed(lm) is None
        props = _props(lm)
        assert props["default_generation_settings"]["n_ctx"] == 1024 and props.get("total_slots") == 1
        with RecordingProxy(lm.port, api_key=lm.api_key) as proxy:
            async with via(proxy) as c:
                prompt = "What is the capital of France? Answer in one word."
                r = ok(await c.call_tool("respond", {"prompt": prompt, **SETTINGS}))
            chats = proxy.answered_chats()
        assert "paris" in r["text"].lower(), r["text"]
        assert chats and chats[-1].usage and chats[-1].timings, "usage and llama.cpp's timings reported"
        print(f"\n{kind}: ready and one decode in {ready_s:.2f} s")
    finally:
        lm.stop()
