"""Facts both languages need, declared once on each side: the shim's copy must agree with
the core's. Asked of the real core where it can tell; read from the Swift source where only
the source says (the error codes, the pipe's version). The model-tool catalogue has its own
check, beside the model-tools tests (test_tools.py)."""

from __future__ import annotations

import re
import subprocess

import msgspec
import pytest

from harness import REPO, core_exchange, core_path
from wisp_shim import errors
from wisp_shim import protocol
from wisp_shim.__main__ import BACKENDS, DEFAULT_MAX_THREADS, FLAG_MINIMUMS
from wisp_shim.tool_models import REASONING_LEVELS, THREAD_ID_RE


def _swift_sources() -> str:
    """All of the core's Swift source, so a fact is found wherever the file that holds it moved."""
    return "\n".join(f.read_text() for f in sorted((REPO / "swift").rglob("*.swift")))


def _core_refuses(*args: str) -> str:
    proc = subprocess.run([core_path(), *args], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert proc.returncode != 0, f"wisp-core accepted {args}"
    return proc.stderr.decode()


def test_the_error_codes_agree_with_the_cores():
    block = re.search(r"enum Code: String[^{]*\{(.*?)\n    \}", _swift_sources(), re.S)
    assert block, "WispError.Code not found in swift/"
    swift = {raw or name for name, raw in re.findall(r'^\s*case\s+`?(\w+)`?(?:\s*=\s*"([^"]+)")?', block.group(1), re.M)}
    assert swift == set(errors.CORE_CODES)
    assert not errors.SHIM_CODES & errors.CORE_CODES  # the shim's own never shadow one of the core's


def test_the_pipe_version_and_frame_limit_agree_with_the_cores():
    source = _swift_sources()
    version = re.search(r"\bprotocolVersion\s*=\s*(\d+)", source)
    assert version and int(version.group(1)) == protocol.PROTOCOL_VERSION
    # A frame of exactly the limit is read; one byte more is refused before it is read.
    status = msgspec.json.encode(protocol.Status(id=1))
    at_limit = status + b" " * (protocol.MAX_FRAME_BYTES - len(status))
    frames = core_exchange(["--backend", "echo"], protocol.frame(at_limit))
    assert any(f.get("id") == 1 and f.get("ok") for f in frames), frames
    # One byte more: the core stops at the header, with stdin still open, and says why.
    proc = subprocess.Popen([core_path(), "--backend", "echo"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        proc.stdin.write((protocol.MAX_FRAME_BYTES + 1).to_bytes(4, "big") + protocol.frame(status))
        proc.stdin.flush()
        assert proc.wait(timeout=30) != 0, "wisp-core took a frame over the shim's limit"
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


def test_the_default_max_threads_agrees_with_the_cores():
    frames = core_exchange(["--backend", "echo"], protocol.encode(protocol.Status(id=1)))
    status = next(f for f in frames if f.get("id") == 1)
    assert status["result"]["max_threads"] == DEFAULT_MAX_THREADS


@pytest.mark.parametrize("flag", sorted(FLAG_MINIMUMS))
def test_the_flag_minimums_agree_with_the_cores(flag):
    minimum = FLAG_MINIMUMS[flag]
    assert f"≥ {minimum}" in _core_refuses("--backend", "echo", flag, str(minimum - 1))
    # The minimum itself is taken: the core starts and answers.
    frames = core_exchange(["--backend", "echo", flag, str(minimum)], protocol.encode(protocol.Status(id=1)))
    assert any(f.get("id") == 1 and f.get("ok") for f in frames), frames


def test_the_backend_list_agrees_with_the_cores():
    said = _core_refuses("--backend", "no-such-backend")
    named = re.search(r"backend must be (.*?), got", said)
    assert named, said
    assert set(re.split(r", | or ", named.group(1))) == set(BACKENDS)


@pytest.mark.parametrize("thread_id", ["a", "A.b_c-9", "x" * 64, "x" * 65, "", "a b", "é", "a/b", "a\n"])
def test_the_thread_id_rule_agrees_with_the_cores(thread_id):
    request = protocol.Respond(id=1, prompt="hi", thread_id=thread_id)
    frames = core_exchange(["--backend", "echo"], protocol.encode(request))
    reply = next(f for f in frames if f.get("id") == 1)
    shim_accepts = THREAD_ID_RE.fullmatch(thread_id) is not None
    assert reply["ok"] == shim_accepts, reply
    if not shim_accepts:
        assert reply["error"]["code"] == errors.INVALID_ARGUMENT


def test_the_reasoning_levels_agree_with_the_cores():
    # The core names its levels when it refuses another; each of the shim's is taken.
    asks = [protocol.Respond(id=1, prompt="hi", options=protocol.RespondOptions(reasoning="fast"))]
    asks += [protocol.Respond(id=2 + k, prompt="hi", options=protocol.RespondOptions(reasoning=level)) for k, level in enumerate(REASONING_LEVELS)]
    frames = core_exchange(["--backend", "echo"], b"".join(protocol.encode(m) for m in asks), want=tuple(m.id for m in asks))
    replies = {f["id"]: f for f in frames if "ok" in f}
    said = replies[1]["error"]["message"]
    named = re.search(r"reasoning must be one of (.*?), got 'fast'", said)
    assert named, said
    assert named.group(1).split(", ") == list(REASONING_LEVELS)
    assert all(replies[2 + k]["ok"] for k in range(len(REASONING_LEVELS))), replies
