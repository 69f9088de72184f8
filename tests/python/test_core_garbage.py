"""The core writing what the shim cannot trust: frames that break the protocol (garbage,
oversized, truncated), a result that does not decode, the wrong protocol version. Each ends
that core, fails its calls as a crash, and the shim restarts it."""

from __future__ import annotations

import asyncio
import sys
import time

import anyio
import pytest

from harness import error_text, fake_core_binary, fake_core_starts, ok, running, shim_env, stub_core, wait_for, wisp
from wisp_shim.version import version



FRAME_FAULTS = [
    ("!garbage", "protocol error"),  # a frame whose payload is not JSON
    ("!oversized", "over the"),  # a length prefix over the 16 MiB limit
    ("!truncated", "inside a frame"),  # the stream ends inside a frame
    ("!badjson", "protocol error"),  # JSON, but no message of the protocol
]


async def test_a_core_that_breaks_the_frame_protocol_is_restarted_cleanly(tmp_path):
    """Each fault in turn, in one session: the call fails at once saying why, the broken
    core is killed (not orphaned), a fresh one serves the next call, and the threads of
    the broken one are reported lost."""
    core, starts = fake_core_binary(tmp_path)
    async with wisp(core=core, env=shim_env(WISP_FAKE_CORE_LOG=str(starts))) as c:
        for n, (fault, reason) in enumerate(FRAME_FAULTS, start=1):
            keep = f"keep-{n}"
            assert ok(await c.call_tool("respond", {"prompt": "keep", "thread_id": keep}))["text"] == "echo 1: keep"
            broken = int(starts.read_text().split()[-1])
            start = time.monotonic()
            msg = error_text(await asyncio.wait_for(c.call_tool("respond", {"prompt": f"{fault} now", "thread_id": "bad"}), 10))
            assert msg.startswith("core_crashed:") and reason in msg and "bad" in msg, (fault, msg)
            assert time.monotonic() - start < 3.0, fault
            await wait_for(lambda broken=broken: not running(broken), 5)
            r = ok(await c.call_tool("respond", {"prompt": "after", "thread_id": f"new-{n}"}))
            assert (r["created"], r["text"]) == (True, "echo 1: after"), fault
            assert len(starts.read_text().split()) == n + 1, fault
            lost = error_text(await c.call_tool("respond", {"prompt": "keep?", "thread_id": keep}))
            assert lost.startswith("thread_lost:"), (fault, lost)


@pytest.mark.parametrize("fault, named", [
    ("!badresult", "RespondResult"),  # a result that does not decode
    ("!wrongresult", "CloseThreadResult"),  # a result for another op
])
async def test_a_reply_whose_result_is_not_its_calls_restarts_the_core(tmp_path, fault, named):
    core, starts = fake_core_binary(tmp_path)
    async with wisp(core=core, env=shim_env(WISP_FAKE_CORE_LOG=str(starts))) as c:
        assert ok(await c.call_tool("respond", {"prompt": "keep", "thread_id": "keep"}))["text"] == "echo 1: keep"
        broken = fake_core_starts(starts)[-1]
        msg = error_text(await asyncio.wait_for(c.call_tool("respond", {"prompt": fault, "thread_id": "bad"}), 10))
        assert msg.startswith("core_crashed:") and "protocol error" in msg and named in msg and "'bad'" in msg, msg
        await wait_for(lambda broken=broken: not running(broken), 5)
        r = ok(await c.call_tool("respond", {"prompt": "after", "thread_id": "new"}))
        assert (r["created"], r["text"]) == (True, "echo 1: after")
        assert len(fake_core_starts(starts)) == 2
        lost = error_text(await c.call_tool("respond", {"prompt": "keep?", "thread_id": "keep"}))
        assert lost.startswith("thread_lost:") and "keep" in lost, lost


async def test_garbage_from_the_core_fails_calls_and_restarts_it(tmp_path):
    # Garbage once the call has been written to it (its frame's length prefix has come).
    stub = stub_core(tmp_path, "sys.stdin.buffer.read(4)\nframe(b'this is not json')\nsys.stdin.buffer.read()\n")
    async with wisp(core=stub) as c:
        with anyio.fail_after(10):
            msg = error_text(await c.call_tool("respond", {"prompt": "hi", "thread_id": "t"}))
        assert msg.startswith("core_crashed:") and "protocol error" in msg, msg


async def test_wrong_protocol_version_is_refused(tmp_path):
    stub = tmp_path / "wisp-core"
    stub.write_text(
        f"#!{sys.executable}\nimport json, struct, sys\n"
        # The shim's own version, so that the pipe's version is the one refused.
        "b = json.dumps({'id': 0, 'event': 'ready', 'protocol': 99, 'backend': 's', 'model': 's', 'pid': 0, "
        f"'version': {version()!r}}}).encode()\n"
        "sys.stdout.buffer.write(struct.pack('>I', len(b)) + b); sys.stdout.buffer.flush(); sys.stdin.buffer.read()\n"
    )
    stub.chmod(0o755)
    async with wisp(core=str(stub)) as c:
        with anyio.fail_after(10):
            msg = error_text(await c.call_tool("respond", {"prompt": "hi"}))
        assert msg.startswith("core_unavailable:") and "protocol 99" in msg, msg
