"""Several model servers, as the core checks them (docs/backends.md "Several model servers"):
an endpoint that is down is checked again on a timer of its own, with no call or `status` to
start it, and `status` reports each endpoint as last found without waiting on one that never
answers. Through the shim's own core client, against scripted servers (openai_stub.py,
unruly_server.py)."""

from __future__ import annotations

import time

import anyio
from harness import core_path
from openai_stub import OpenAIStub, StubConfig, closed_port
from unruly_server import Silent
from wisp_shim.core.client import Core
from wisp_shim.core.process import CoreLaunch

# docs/backends.md: an endpoint's check has 3 s in all, and one down is checked again after 5 s;
# the waits below leave room for a loaded machine.
CHECK_BOUND_S = 3
ROOM_S = 30


def fleet_core(*endpoints: str) -> Core:
    flags = [x for e in endpoints for x in ("--endpoint", e)]
    return Core(CoreLaunch(core=core_path(), args=["--backend", "openai", "--model", "stub-model", *flags]))


def probes(stub: OpenAIStub) -> int:
    return sum(r.path == "/v1/models" for r in stub.requests)


async def test_an_endpoint_down_is_checked_again_with_no_call_and_comes_back():
    port = closed_port()
    with OpenAIStub() as b:
        core = fleet_core(f"http://127.0.0.1:{port}/v1", b.endpoint)
        core.start()
        try:
            st = await core.status()  # waits for the first checks only
            assert st.endpoints is not None and [e.up for e in st.endpoints] == [False, True], st.endpoints
            with OpenAIStub(port=port) as a:
                # No call and no status meanwhile: only the core's own timer can send this probe.
                with anyio.fail_after(ROOM_S):
                    while not probes(a):
                        await anyio.sleep(0.05)
                with anyio.fail_after(ROOM_S):  # the probes of one check, then it is up
                    while not (st := await core.status()).endpoints[0].up:
                        await anyio.sleep(0.1)
                assert (st.endpoints[0].model, st.endpoints[0].context_size) == ("stub-model", 4096), st.endpoints
                assert not a.chats() and not b.chats()
        finally:
            await core.aclose()


async def test_an_endpoint_that_never_answers_slows_no_status():
    with Silent() as wedged, OpenAIStub() as a:
        core = fleet_core(wedged.endpoint, a.endpoint)
        core.start()
        try:
            st = await core.status()  # its first check, which gives up at its bound
            assert st.endpoints is not None
            assert (st.endpoints[0].up, st.endpoints[0].reason) == (False, f"no answer within {CHECK_BOUND_S} s")
            # Each status used to check every endpoint again: 3 statuses, at least 3 x 3 s.
            start = time.monotonic()
            for _ in range(3):
                st = await core.status()
                assert [e.up for e in st.endpoints] == [False, True], st.endpoints
            took = time.monotonic() - start
            assert took < CHECK_BOUND_S, took
            assert st.available, st.reason
        finally:
            await core.aclose()


async def test_an_endpoint_that_answered_then_went_away_is_asked_again_on_its_recheck():
    """Its recheck asks the server, rather than taking the answer it gave a few seconds before
    it went away for a sign that it is up."""
    with OpenAIStub() as a, OpenAIStub() as b:
        core = fleet_core(a.endpoint, b.endpoint)
        core.start()
        try:
            await core.status()
            home = f"127.0.0.1:{a.port}"
            tid = None
            for t in (f"t{i}" for i in range(64)):  # about half go there
                r = await core.respond("hi", thread_id=t)
                if r.usage is not None and r.usage.endpoint == home:
                    tid = t
                    break
            assert tid is not None
            a.__exit__(None, None, None)
            moved = await core.respond("and now?", thread_id=tid)  # refused there: marked down, moved
            assert moved.usage is not None and moved.usage.endpoint == f"127.0.0.1:{b.port}", moved
            with OpenAIStub(StubConfig(models_status=503), port=a.port) as loading:
                with anyio.fail_after(ROOM_S):
                    while not probes(loading):
                        await anyio.sleep(0.05)
                st = await core.status()
                assert not st.endpoints[0].up and "HTTP 503" in (st.endpoints[0].reason or ""), st.endpoints
        finally:
            await core.aclose()
