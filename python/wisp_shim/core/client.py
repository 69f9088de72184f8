"""The shim's client of wisp-core: sends respond, close_thread, status and read_thread, enforces
their time limits (cancelling in the core when one passes), forwards progress, and keeps the ids
of threads lost in a crash so the next call naming one is told so.

The process itself is process.py's; starting, watching and restarting it, core/supervisor.py's.
Everything here is MCP-agnostic: failures are raised as ShimError, which the MCP layer
turns into tool errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from .. import errors
from . import protocol
from ..errors import ShimError
from .process import MAX_REMEMBERED_IDS, CoreLaunch, CoreProcess
from .arrivals import Arrivals, Place
from .pending import PendingCall, Answer
from .progress import OnProgress, pump_progress
from .supervisor import Supervisor

log = logging.getLogger("wisp.core")

# When a call's time limit passes, the shim cancels it in the core and waits this long for
# the call's own reply: a reply that beat the cancel is the call's true outcome.
CANCEL_GRACE_S = 0.25
# close_thread and status never wait for a model.
QUICK_CALL_TIMEOUT_S = 30.0


class Core:
    """Client of one wisp-core child, which its Supervisor restarts whenever it dies."""

    def __init__(self, launch: CoreLaunch) -> None:
        self.launch = launch
        self._supervisor = Supervisor(launch, self)
        self._next_id = 0
        # Ids whose history died with a core; the next respond naming one is told so.
        self.lost: OrderedDict[str, None] = OrderedDict()
        # Ids of threads this wisp has answered for (most recent last), so that a call that starts
        # a new thread under one of them can say the old one is gone, and a new id says nothing.
        self._known: OrderedDict[str, None] = OrderedDict()
        self._arrivals = Arrivals()

    def arrive(self, thread_id: str | None) -> Place:
        """A respond call's place on its thread, taken as it arrives, before it awaits anything
        (core/arrivals.py); hand it to `respond`, and `leave` it if the call never gets there."""
        return self._arrivals.arrive(thread_id)

    def knew(self, thread_id: str) -> bool:
        """Whether this wisp has held a thread under `thread_id` (since it started, among the
        most recent MAX_REMEMBERED_IDS)."""
        return thread_id in self._known

    @property
    def binary(self) -> Path | None:
        """The wisp-core binary last started."""
        return self._supervisor.binary

    def start(self) -> None:
        """Begin starting the core in the background; calls wait for it to be ready."""
        self._supervisor.start()

    async def aclose(self) -> None:
        """Stop the core: close its stdin, then SIGTERM, then SIGKILL."""
        await self._supervisor.aclose()

    # --- CoreListener: what the supervisor reports ----------------------------

    def next_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def dispatch(self, run: CoreProcess, msg: protocol.CoreMessage) -> None:
        if isinstance(msg, protocol.Reply):
            call = run.pending.get(msg.id)
            if call is None:
                if run.ping is not None and run.ping[0] == msg.id:
                    run.ping = None
                else:
                    # A reply to a call we gave up on (cancelled) or to a cancel.
                    log.debug("reply for request %d nobody waits for", msg.id)
                return
            result = msg.result if msg.ok else None
            if result is not None:
                # A result for another op is a broken frame like any other: the ProtocolError ends
                # this core (the stream cannot be trusted, nor the shim's view of its threads), and
                # every pending call, this one included, fails as in a crash.
                if not isinstance(result, call.result_type):
                    raise protocol.ProtocolError(f"reply {msg.id} carries a {type(result).__name__}, not the "
                                                 f"{call.result_type.__name__} its request wants")
                self._track(run, result)
                if isinstance(result, protocol.RespondResult):
                    self._known[result.thread_id] = None
                    self._known.move_to_end(result.thread_id)
                    if len(self._known) > MAX_REMEMBERED_IDS:
                        self._known.popitem(last=False)
            # An error reply goes to its caller as it is. That includes the core's invalid_argument
            # for a request frame it could read an id from but not decode as an op: such a frame is
            # the shim's own bug, not a sign that the core is broken, and restarting the core for it
            # would lose every thread without fixing anything.
            del run.pending[msg.id]
            target = call.future if not call.future.done() else call.late
            if target is not None and not target.done():
                target.set_result(msg)
        elif isinstance(msg, protocol.Progress):
            call = run.pending.get(msg.id)

            if call is not None and call.progress_event is not None:
                call.latest = (msg.tokens, msg.chars, msg.text)
                call.newest = "text"
                call.progress_event.set()
        elif isinstance(msg, protocol.Stage):
            call = run.pending.get(msg.id)
            if call is not None and call.progress_event is not None:
                call.stage = (msg.stage, msg.count)
                call.newest = "stage"
                call.progress_event.set()
        elif isinstance(msg, protocol.Evicted):
            run.alive.pop(msg.thread_id, None)  # gone already: a later crash did not lose it

    @staticmethod
    def _track(run: CoreProcess, result: protocol.PipeResult) -> None:
        """The shim's view of the core's live threads, updated in frame order: an eviction
        or a close that the core sent after this reply must win over it."""
        if isinstance(result, protocol.RespondResult):
            durable = run.durable
            if durable and result.store_error is None:
                # Stored: a crash from here on loses nothing of it.
                run.alive.pop(result.thread_id, None)
            # A thread closed or evicted while this call ran is not alive again because the call finished.
            elif durable or result.created or result.thread_id in run.alive:
                run.remember(result.thread_id)
        elif isinstance(result, protocol.CloseThreadResult):
            run.alive.pop(result.thread_id, None)

    def core_exited(self, run: CoreProcess, how: str) -> None:
        # A thread is told of its loss by its failed call, unless a task's call was among them: a
        # task's failure is read when collected, so the thread's next call is told (thread_lost).
        in_task = {c.thread_id for c in run.pending.values() if c.thread_id and c.in_task}
        notified = {c.thread_id for c in run.pending.values() if c.thread_id} - in_task
        durable, failed = run.durable, len(run.pending)
        for call in list(run.pending.values()):
            if call.thread_id and durable and call.thread_id not in run.alive:
                tail = (
                    f"Thread {call.thread_id!r} is stored: call respond again with it to continue from its last stored "
                    "turn (this call's turn is in it only if it was stored just before the crash: `turns` tells)."
                )
            elif call.thread_id in in_task and call.thread_id in run.alive:
                tail = (
                    f"Thread {call.thread_id!r}'s history was lost with it: the next respond call naming it gets "
                    f"{errors.THREAD_LOST}, and the one after starts a new thread."
                )
            elif call.thread_id:
                tail = (
                    f"Thread {call.thread_id!r}'s history was lost with it: call respond again "
                    "(with the same thread_id or none) to start a new thread."
                )
            else:
                tail = "No thread was created for this call: call respond again to start one."
            crashed = f"the wisp core crashed ({how}) while this call was running and has been restarted. {tail}"
            self._fail(call, ShimError(errors.CORE_CRASHED, crashed))
        run.pending.clear()
        # Callers whose own call failed above were told already; everyone else
        # learns on their next call.
        # With a state dir, `alive` holds only threads whose latest turn could not be stored.
        lost = [t for t in run.alive if t not in notified]
        for t in lost:
            self.lost[t] = None
        while len(self.lost) > MAX_REMEMBERED_IDS:
            self.lost.popitem(last=False)
        log.error("wisp-core %s; %d pending call(s) failed, %d thread(s) lost", how, failed, len(run.alive))

    @staticmethod
    def _fail(call: PendingCall, exc: ShimError) -> None:
        for fut in (call.future, call.late):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
                fut.exception()  # the waiter may already be gone; don't warn about it

    def _fail_pending(self, run: CoreProcess, exc: ShimError) -> None:
        for call in list(run.pending.values()):
            self._fail(call, exc)
        run.pending.clear()

    def shutting_down(self, run: CoreProcess) -> None:
        self._fail_pending(run, ShimError(errors.SHUTTING_DOWN, "wisp is shutting down; the call was not finished."))

    # --- calls -------------------------------------------------------------

    async def placement(self, thread_id: str | None) -> tuple[str, bool]:
        """What a respond call on `thread_id` would meet now: the running core's backend, and
        whether another respond call on that thread is running or queued in it."""
        run = await self._supervisor.running()
        behind = thread_id is not None and any(
            c.thread_id == thread_id and c.result_type is protocol.RespondResult for c in run.pending.values()
        )
        return run.ready.result().backend, behind

    def _send_cancel(self, run: CoreProcess, request_id: int) -> None:
        run.send(protocol.encode(protocol.Cancel(id=self.next_id(), request=request_id)))

    async def _request(self, run: CoreProcess, call: PendingCall, data: bytes | list[bytes], timeout: float,
                       on_timeout: Callable[[], ShimError],
                       on_progress: OnProgress | None = None,
                       stop: asyncio.Future[None] | None = None, on_sent: Callable[[], None] | None = None) -> Answer:
        if run.dead:
            raise ShimError(errors.CORE_CRASHED,
                            "the wisp core crashed just before this call was sent and is restarting; call again.")
        run.pending[call.id] = call
        # A timer handle rather than asyncio.wait_for: this path is on every call's round trip.
        timer = asyncio.get_running_loop().call_later(timeout, _expire, call)
        pump = None
        if on_progress is not None and call.progress_event is not None:
            pump = asyncio.get_running_loop().create_task(
                pump_progress(call, on_progress, self.launch.progress_every_s))
        try:
            try:
                # Inside the try: once the frame may be queued, a cancellation must reach the core.
                run.send(data.pop() if isinstance(data, list) else data)
                if on_sent is not None:
                    on_sent()
                answer = await (call.future if stop is None else self._unless_stopped(run, call, stop))
            except _Expired:
                answer = await self._after_expiry(run, call, on_timeout)
            except asyncio.CancelledError:
                # MCP cancellation: tell the core so the thread is freed, then let it propagate.
                self._send_cancel(run, call.id)
                raise
            if pump is not None:
                # Let the pump send the last partial (it usually lands with the reply) before
                # the result goes out: cancelling it mid-send could lose or repeat one.
                assert call.answered is not None and call.progress_event is not None
                call.answered.set()
                call.progress_event.set()
                with contextlib.suppress(Exception):
                    await pump
                pump = None
            return answer
        finally:
            timer.cancel()
            run.pending.pop(call.id, None)
            if pump is not None:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump

    async def _unless_stopped(self, run: CoreProcess, call: PendingCall, stop: asyncio.Future[None]) -> Answer:
        """The call's reply; once `stop` is set first, the call is cancelled in the core and its
        reply is the core's verdict: `cancelled` (the turn not kept), or the result that beat the
        cancel (the turn kept). Bounded like any call: by its time limit and the watchdog."""
        if not stop.done():
            await asyncio.wait((call.future, stop), return_when=asyncio.FIRST_COMPLETED)
        if not call.future.done():
            self._send_cancel(run, call.id)
        return await call.future

    async def _after_expiry(self, run: CoreProcess, call: PendingCall, on_timeout: Callable[[], ShimError]) -> Answer:
        """The time limit passed: cancel the call in the core and give its own reply a moment.
        A success (or a real failure) that beat the cancel is the call's outcome; the core's
        own `timeout` or `cancelled` answer, or silence, is the shim's timeout error."""
        late = call.late
        assert late is not None  # made by _expire
        self._send_cancel(run, call.id)
        try:
            reply = await asyncio.wait_for(late, CANCEL_GRACE_S)
        except asyncio.TimeoutError:
            raise on_timeout() from None
        if not reply.ok and reply.error is not None and reply.error.code in (errors.TIMEOUT, errors.CANCELLED):
            raise on_timeout()
        return reply

    async def respond(
        self,
        prompt: str,
        thread_id: str | None = None,
        instructions: str | None = None,
        tools: list[str] | None = None,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        on_progress: OnProgress | None = None,
        roots: list[str] | None = None,
        files: list[str] | None = None,
        schema: str | None = None,
        reasoning: str | None = None,
        fork_from: str | None = None,
        rewind: int | None = None,
        stop: asyncio.Future[None] | None = None,
        on_sent: Callable[[], None] | None = None,
        place: Place | None = None,
    ) -> protocol.RespondResult:
        """`stop` (set by a task's cancel): cancel the call as an MCP cancel would, but wait for the
        core's verdict (a ShimError `cancelled`, or the result that came first). `on_sent`: called once
        the call has its place in the core's queue (its frame is written). `place`: the call's place
        among its thread's arrivals (`arrive`), left here once its frame is written; the caller leaves
        it if the call fails before."""
        place = place if place is not None else Place(None, None, None)
        self._refuse_lost(thread_id, fork_from)
        limit = self.launch.timeout_s
        # The limit counts from the call's arrival, the wait behind its thread's earlier arrivals too.
        arrived = protocol.monotonic_now()
        if place.behind:  # most calls are not: asyncio.wait_for costs a task on the round trip
            await _wait_for_place(place, limit, thread_id)
        run = await self._supervisor.running()
        call_id = self.next_id()
        deadline = arrived + limit
        remaining = max(deadline - protocol.monotonic_now(), 0.0)
        # The core gets the same limit as an instant on the clock both read, so that it neither runs
        # nor commits a call past it, even one it reads late (stopped, or busy, while it queued).
        options = protocol.RespondOptions(temperature=temperature, max_output_tokens=max_output_tokens, timeout_s=limit,
                                   deadline=deadline, reasoning=reasoning)
        # The request's bytes are not held while the call runs (the box is emptied as it is sent):
        # with 128 calls of megabytes in flight, the copies would add up.
        box = [_framed(protocol.Respond(
            id=call_id, prompt=prompt, thread_id=thread_id, instructions=instructions, tools=tools,
            options=options, progress=True if on_progress is not None else None, roots=roots or None,
            files=files or None, schema=schema, fork_from=fork_from, rewind=rewind,
        ))]
        timed_out = _respond_timeout(limit, thread_id)
        call = PendingCall(call_id, thread_id, on_progress is not None, protocol.RespondResult)
        call.in_task = stop is not None  # only a task's call has a stop signal of its own
        started = time.monotonic()
        if stop is not None and stop.done():
            raise ShimError(errors.CANCELLED, "the call was cancelled before it started; nothing reached the model.")
        def sent() -> None:
            place.leave()  # the next call on this thread may now be written behind this one
            if on_sent is not None:
                on_sent()

        reply = await self._request(run, call, box, remaining, timed_out, on_progress, stop, sent)
        if not reply.ok:
            assert reply.error is not None
            if reply.error.code == errors.TIMEOUT:
                raise timed_out()  # the core's deadline is the shim's limit: one wording for both
            error = ShimError(reply.error.code, reply.error.message)
            if self.launch.companion is not None:
                error = await self.launch.companion.explain(error, started)
            raise error
        assert isinstance(reply.result, protocol.RespondResult)
        return reply.result

    def _refuse_lost(self, thread_id: str | None, fork_from: str | None) -> None:
        """A thread the core lost in a crash is refused once, by name (docs/threads.md), not started afresh."""
        if fork_from is not None and fork_from in self.lost:
            raise ShimError(
                errors.THREAD_LOST,
                f"thread {fork_from!r}'s history was lost when the wisp core crashed and restarted, so there is "
                "nothing to fork. Nothing was sent to the model.",
            )
        if thread_id is not None and thread_id in self.lost:
            del self.lost[thread_id]
            raise ShimError(
                errors.THREAD_LOST,
                f"thread {thread_id!r}'s history was lost when the wisp core crashed and restarted. "
                "Nothing was sent to the model. Call respond again (with the same thread_id or none) to start "
                "a new thread, and resend whatever context it needs.",
            )

    async def close_thread(self, thread_id: str) -> protocol.CloseThreadResult:
        # Closing a lost thread is what the caller would do anyway: no notice needed.
        self.lost.pop(thread_id, None)
        call = PendingCall(self.next_id(), thread_id, False, protocol.CloseThreadResult)
        result = await self._quick(call, protocol.CloseThread(id=call.id, thread_id=thread_id))
        assert isinstance(result, protocol.CloseThreadResult)
        return result

    async def status(self, query: str | None = None, limit: int | None = None,
                     cursor: str | None = None) -> protocol.StatusResult:
        call = PendingCall(self.next_id(), None, False, protocol.StatusResult)
        result = await self._quick(call, protocol.Status(id=call.id, query=query, limit=limit, cursor=cursor))
        assert isinstance(result, protocol.StatusResult)
        return result

    async def read_thread(self, thread_id: str, last: int | None, max_bytes: int) -> protocol.ReadThreadResult:
        call = PendingCall(self.next_id(), None, False, protocol.ReadThreadResult)
        asked = protocol.ReadThread(id=call.id, thread_id=thread_id, last=last, max_bytes=max_bytes)
        result = await self._quick(call, asked)
        assert isinstance(result, protocol.ReadThreadResult)
        return result

    async def _quick(self, call: PendingCall, message: protocol.PipeRequest) -> protocol.PipeResult:
        """A call that never waits for a model: its reply's result, or its error raised."""
        run = await self._supervisor.running()
        timed_out = _quick_timeout(protocol.op_name(type(message)))
        reply = await self._request(run, call, protocol.encode(message), QUICK_CALL_TIMEOUT_S, timed_out)
        if not reply.ok:
            assert reply.error is not None
            raise ShimError(reply.error.code, reply.error.message)
        assert reply.result is not None
        return reply.result


class _Expired(Exception):
    """The shim's own time limit for a call passed before the core replied."""


def _expire(call: PendingCall) -> None:
    if not call.future.done():
        # Before the waiter wakes: a reply arriving in between must find somewhere to land.
        call.late = asyncio.get_running_loop().create_future()
        call.future.set_exception(_Expired())


async def _wait_for_place(place: Place, limit: float, thread_id: str | None) -> None:
    try:
        await asyncio.wait_for(place.turn(), limit)
    except TimeoutError:
        raise ShimError(
            errors.TIMEOUT,
            f"no reply within {limit:g} s: the calls that arrived before it on thread {thread_id!r} were "
            "still waiting to be sent (for the MCP client's roots), so nothing reached the model and the "
            "thread is unchanged. (--timeout / WISP_TIMEOUT sets the limit for respond.)",
        ) from None


def _framed(msg: protocol.Respond) -> bytes:
    """The call's frame, refused before anything is sent when it is over the pipe's limit."""
    payload = protocol.encode_payload(msg)
    if len(payload) > protocol.MAX_FRAME_BYTES:
        raise ShimError(
            errors.INVALID_ARGUMENT,
            f"the request is {len(payload)} bytes, over wisp's {protocol.MAX_FRAME_BYTES // (1024 * 1024)} MiB "
            "limit; send a shorter prompt (or split the work across several calls).",
        )
    return protocol.frame(payload)


def _respond_timeout(limit: float, thread_id: str | None) -> Callable[[], ShimError]:
    def timed_out() -> ShimError:
        left = f"thread {thread_id!r} is unchanged" if thread_id is not None else "no thread was created"
        return ShimError(
            errors.TIMEOUT,
            f"no reply within {limit:g} s; the call was stopped and {left}. "
            "(--timeout / WISP_TIMEOUT sets the limit for respond.)",
        )
    return timed_out


def _quick_timeout(op: str) -> Callable[[], ShimError]:
    return lambda: ShimError(errors.TIMEOUT,
                             f"wisp-core did not answer `{op}` within {QUICK_CALL_TIMEOUT_S:g} s; call again.")
