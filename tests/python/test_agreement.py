"""The facts the shim takes from the core (facts.py, core_facts.json) are the built core's:
the copy is compared with what `wisp-core --facts` says, and the core is seen to work by them
(it reads a frame of the limit, refuses a flag below its minimum, takes each backend and
reasoning level, and judges thread ids as the shim's pattern does). Nothing here reads Swift
source or an error's wording."""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import msgspec
import pytest

from harness import core_exchange, core_path
from wisp_shim import errors, facts
from wisp_shim.core import protocol
from wisp_shim.facts import BACKENDS, DEFAULT_MAX_THREADS, FLAG_MINIMUMS, REASONING_LEVELS, THREAD_ID_RE


def _core_refuses(*args: str) -> None:
    proc = subprocess.run([core_path(), *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert proc.returncode != 0, f"wisp-core accepted {args}"


def _core_serves(*args: str) -> dict:
    """The status reply of a core started with `args`."""
    frames = core_exchange(list(args), protocol.encode(protocol.Status(id=1)))
    status = next((f for f in frames if f.get("id") == 1 and "ok" in f), None)
    assert status and status["ok"], frames
    return status["result"]


def test_the_shims_copy_of_the_facts_is_the_built_cores():
    proc = subprocess.run([core_path(), "--facts"], stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=True)
    assert json.loads(proc.stdout) == facts.FACTS, "python/wisp_shim/core_facts.json is stale: run `make facts`"


def test_every_operation_the_core_reads_has_exactly_one_request_here_and_back():
    ours, theirs = Counter(protocol.OP_NAMES), Counter(facts.OPERATIONS)
    assert theirs and max(theirs.values()) == 1, f"the core states an op more than once: {theirs}"
    assert {op for op, n in ours.items() if n > 1} == set(), f"protocol.OPERATIONS declares an op twice: {ours}"
    assert set(theirs) - set(ours) == set(), "ops the core reads that have no request in protocol.OPERATIONS"
    assert set(ours) - set(theirs) == set(), "requests in protocol.OPERATIONS that the core does not read"


def test_the_shims_codes_are_its_own_or_the_cores():
    assert errors.NAMED_CORE_CODES <= errors.CORE_CODES
    assert not errors.SHIM_CODES & errors.CORE_CODES  # the shim's own never shadow one of the core's


def test_the_core_says_its_pipe_version_and_reads_a_frame_of_the_limit():
    status = msgspec.json.encode(protocol.Status(id=1))
    at_limit = status + b" " * (protocol.MAX_FRAME_BYTES - len(status))
    frames = core_exchange(["--backend", "echo"], protocol.frame(at_limit))
    assert frames[0].get("event") == "ready" and frames[0]["protocol"] == protocol.PROTOCOL_VERSION, frames[0]
    assert any(f.get("id") == 1 and f.get("ok") for f in frames), frames
    # One byte more: the core stops at the header, with stdin still open.
    proc = subprocess.Popen([core_path(), "--backend", "echo"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        proc.stdin.write((protocol.MAX_FRAME_BYTES + 1).to_bytes(4, "big") + protocol.frame(status))
        proc.stdin.flush()
        assert proc.wait(timeout=30) != 0, "wisp-core took a frame over its limit"
    finally:
        proc.kill()
        proc.stdin.close()
        proc.stderr.close()


def test_the_core_reads_a_deadline_on_the_shims_clock():
    """RespondOptions.deadline is an instant of protocol.monotonic_now(): the core, another
    process, must read the same clock. A deadline just past is refused without running (and
    creates no thread); one a minute ahead is served."""
    now = protocol.monotonic_now()
    past = protocol.RespondOptions(timeout_s=2.0, deadline=now - 0.5)
    ahead = protocol.RespondOptions(timeout_s=60.0, deadline=now + 60)
    frames = core_exchange(["--backend", "echo"], protocol.encode(protocol.Respond(id=1, prompt="late", thread_id="late", options=past))
                           + protocol.encode(protocol.Respond(id=2, prompt="on time", thread_id="ok", options=ahead))
                           + protocol.encode(protocol.Status(id=3)), want=(1, 2, 3))
    by_id = {f["id"]: f for f in frames if "ok" in f}
    assert not by_id[1]["ok"] and by_id[1]["error"]["code"] == "timeout", by_id[1]
    assert "thread 'late' is unchanged" in by_id[1]["error"]["message"], by_id[1]
    assert by_id[2]["ok"] and by_id[2]["result"]["text"] == "echo 1: on time", by_id[2]
    assert [t["thread_id"] for t in by_id[3]["result"]["threads"]] == ["ok"]


def test_the_core_runs_with_its_default_max_threads():
    assert _core_serves("--backend", "echo")["max_threads"] == DEFAULT_MAX_THREADS


@pytest.mark.parametrize("flag", sorted(FLAG_MINIMUMS))
def test_the_core_refuses_a_flag_below_its_minimum_and_takes_the_minimum(flag):
    minimum = FLAG_MINIMUMS[flag]
    _core_refuses("--backend", "echo", flag, str(minimum - 1))
    _core_serves("--backend", "echo", flag, str(minimum))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_core_takes_each_backend_and_no_other(backend):
    # A backend this machine cannot run still starts a core, which says why on every call.
    assert _core_serves("--backend", backend)["backend"] in BACKENDS
    _core_refuses("--backend", "no-such-backend")


@pytest.mark.parametrize("thread_id", ["a", "A.b_c-9", "x" * 64, "x" * 65, "", "a b", "é", "a/b", "a\n", "a-", "^", "\\"])
def test_the_thread_id_pattern_judges_as_the_core_does(thread_id):
    request = protocol.Respond(id=1, prompt="hi", thread_id=thread_id)
    frames = core_exchange(["--backend", "echo"], protocol.encode(request))
    reply = next(f for f in frames if f.get("id") == 1)
    shim_accepts = THREAD_ID_RE.fullmatch(thread_id) is not None
    assert reply["ok"] == shim_accepts, reply
    if not shim_accepts:
        assert reply["error"]["code"] == errors.INVALID_ARGUMENT


def test_the_core_takes_each_reasoning_level_and_no_other():
    asks = [protocol.Respond(id=1, prompt="hi", options=protocol.RespondOptions(reasoning="fast"))]
    asks += [protocol.Respond(id=2 + k, prompt="hi", options=protocol.RespondOptions(reasoning=level)) for k, level in enumerate(REASONING_LEVELS)]
    frames = core_exchange(["--backend", "echo"], b"".join(protocol.encode(m) for m in asks), want=tuple(m.id for m in asks))
    replies = {f["id"]: f for f in frames if "ok" in f}
    assert not replies[1]["ok"] and replies[1]["error"]["code"] == errors.INVALID_ARGUMENT, replies[1]
    assert all(replies[2 + k]["ok"] for k in range(len(REASONING_LEVELS))), replies
