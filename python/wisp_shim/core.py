"""The wisp-core child process: finding it, starting and restarting it, the pipe client,
the thread ids lost in a crash, and shutdown (DESIGN §6).

Everything here is MCP-agnostic: failures are raised as ShimError, which the MCP
layer turns into tool errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from . import protocol as p

log = logging.getLogger("wisp.core")

CORE_NAME = "wisp-core"
BUILD_HINT = (
    "Build it with `make build` in the wisp repository (or `swift build -c release --product wisp-core`), "
    "or point --core / WISP_CORE at an existing wisp-core binary."
)

# A core writes Ready before loading any model, so this only bounds a wedged start.
READY_TIMEOUT_S = 15.0
# When a call's time limit passes, the shim cancels it in the core and waits this long for
# the call's own reply: a reply that beat the cancel is the call's true outcome.
CANCEL_GRACE_S = 0.25
# close_thread and status never wait for a model.
QUICK_CALL_TIMEOUT_S = 30.0
RESTART_BACKOFF_MIN_S = 0.1
RESTART_BACKOFF_MAX_S = 5.0
# A core that lived this long was healthy; its crash restarts at the minimum delay.
HEALTHY_RUN_S = 10.0
# How long a closing core gets after stdin EOF, and then after SIGTERM, before SIGKILL:
# together well under the 2 s in which wisp promises to exit on a signal.
EOF_GRACE_S = 0.5
TERM_GRACE_S = 1.0
# The watchdog: while calls are pending and the core has sent nothing for PING_AFTER_S, the
# shim sends a `ping` (answered by the core's dispatcher at once, whatever the model does);
# if nothing at all comes back within PING_TIMEOUT_S, the core is wedged or stopped and is
# restarted like a crashed one. It looks every WATCHDOG_TICK_S, so a wedged core is found
# within PING_AFTER_S + PING_TIMEOUT_S + 2 ticks (6 s).
PING_AFTER_S = 2.0
PING_TIMEOUT_S = 3.0
WATCHDOG_TICK_S = 0.5
# Progress notifications at most this often: the partial text is cumulative, so
# skipped events lose nothing.
PROGRESS_INTERVAL_S = 0.1
# Bounds for the shim's memory of thread ids, which must not grow without limit
# across a long session.
MAX_REMEMBERED_IDS = 4096


class ShimError(Exception):
    """A failure the caller should see as a tool error: `code: message`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class CoreConfig:
    core: str | None = None
    args: list[str] = field(default_factory=list)
    timeout_s: float = 300.0
    env: dict[str, str] | None = None
    # Awaited before each start of the core, e.g. to bring up the local model server it will
    # talk to (local_model.py); `args` is read after it, so it may add to them. A ShimError it
    # raises fails the start like a missing binary.
    before_start: Callable[[], Awaitable[None]] | None = None
    # Called once the core is stopped for good (aclose), e.g. to stop that server.
    after_stop: Callable[[], None] | None = None
    # Awaited when a respond call fails, with the call's start (time.monotonic()); returns the
    # error the caller sees, e.g. one naming the signal that killed the local model server
    # during the call (the core sees only a broken connection).
    explain: Callable[[ShimError, float], Awaitable[ShimError]] | None = None


def find_core(explicit: str | None = None) -> Path:
    """The wisp-core binary: --core / WISP_CORE, a copy bundled in the package, then
    the repository's release build, searched upward from the package and the cwd."""
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise ShimError("core_missing", f"the wisp-core binary named by --core/WISP_CORE ({path}) is not an executable file. {BUILD_HINT}")
    here = Path(__file__).resolve().parent
    candidates = [here / "bin" / CORE_NAME]
    seen: set[Path] = set()
    for start in (here, Path.cwd().resolve()):
        for d in (start, *start.parents):
            c = d / ".build" / "release" / CORE_NAME
            if c not in seen:
                seen.add(c)
                candidates.append(c)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise ShimError("core_missing", f"the wisp-core binary was not found (looked for {candidates[0]} and .build/release/{CORE_NAME} above {here} and {Path.cwd()}). {BUILD_HINT}")


class _Call:
    __slots__ = ("id", "thread_id", "result_type", "future", "late", "latest", "progress_event", "sent", "answered")

    def __init__(self, call_id: int, thread_id: str | None, want_progress: bool, result_type: type[msgspec.Struct]) -> None:
        self.id = call_id
        self.thread_id = thread_id
        # What an ok reply's result must decode to; decoded as the frame arrives (_dispatch).
        self.result_type = result_type
        self.future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        # Set once the call's time limit passed: its own reply may still come, for a moment.
        self.late: asyncio.Future[_Answer] | None = None
        self.latest: tuple[int, str] | None = None
        self.progress_event = asyncio.Event() if want_progress else None
        # Tokens of the last progress notification sent: each must go higher.
        self.sent = 0
        # Set when the reply is in, so the progress pump flushes and stops.
        self.answered = asyncio.Event() if want_progress else None


# A reply and, when it is ok, its decoded result.
_Answer = tuple[p.Reply, msgspec.Struct | None]


class _Generation:
    """One run of the core process, from spawn to exit."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.started = time.monotonic()
        self.ready: asyncio.Future[p.Ready] = asyncio.get_running_loop().create_future()
        self.pending: dict[int, _Call] = {}
        # Threads this core created for us and that we have not seen closed, oldest first.
        self.alive: OrderedDict[str, None] = OrderedDict()
        self.dead = False
        self.reader: asyncio.Task[tuple[int | None, str | None]] | None = None
        self.stdout_fd = -1  # the read end of the core's stdout
        # The watchdog's view: when the core last sent anything, when we last wrote to it,
        # and the ping it has not answered yet (with when it went out).
        self.last_frame = time.monotonic()
        self.last_send = self.last_frame
        self.ping: tuple[int, float] | None = None
        self.watchdog: asyncio.Task[None] | None = None
        # Why the shim stopped this core itself (the watchdog), for the crash message.
        self.fault: str | None = None

    def remember(self, thread_id: str) -> None:
        self.alive[thread_id] = None
        self.alive.move_to_end(thread_id)
        while len(self.alive) > MAX_REMEMBERED_IDS:
            self.alive.popitem(last=False)


class Core:
    """Client of one wisp-core child, restarted whenever it dies."""

    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self._gen: _Generation | None = None
        self._starting: asyncio.subprocess.Process | None = None
        self._startup_error: ShimError | None = None
        self._changed = asyncio.Event()
        self._kick = asyncio.Event()
        self._closing = False
        self._supervisor: asyncio.Task[None] | None = None
        self._next_id = 0
        # Ids whose history died with a core; the next respond naming one is told so.
        self.lost: OrderedDict[str, None] = OrderedDict()
        self.restarts = 0
        self.ready_info: p.Ready | None = None
        self.binary: Path | None = None

    # --- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Begin starting the core in the background; calls wait for it to be ready."""
        if self._supervisor is None:
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise(), name="wisp-core supervisor")

    async def aclose(self) -> None:
        """Stop the core: close its stdin, then SIGTERM, then SIGKILL."""
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor
        gen = self._gen
        procs = [x for x in (self._starting, gen.proc if gen else None) if x is not None]
        if gen is not None:
            if gen.watchdog is not None:
                gen.watchdog.cancel()
            self._fail_pending(gen, ShimError("shutting_down", "wisp is shutting down; the call was not finished."))
        for proc in procs:
            await _stop_process(proc)
        if self.config.after_stop is not None:
            self.config.after_stop()
        self._notify()

    def _notify(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    async def _supervise(self) -> None:
        backoff = RESTART_BACKOFF_MIN_S
        while not self._closing:
            self._kick.clear()
            gen = await self._start_once()
            if gen is None:
                # Start failed: waiting calls have the reason; retry on the next call or later.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), timeout=max(backoff, 1.0) * 10)
                backoff = min(backoff * 2, RESTART_BACKOFF_MAX_S)
                continue
            rc, reason = await self._serve(gen)
            if self._closing:
                return
            lived = time.monotonic() - gen.started
            self._on_death(gen, rc, reason)
            if lived >= HEALTHY_RUN_S:
                backoff = RESTART_BACKOFF_MIN_S
            log.warning("restarting wisp-core in %.1f s", backoff)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_MAX_S)
            self.restarts += 1

    async def _start_once(self) -> _Generation | None:
        try:
            if self.config.before_start is not None:
                await self.config.before_start()
            path = find_core(self.config.core)
            self.binary = path
            argv = [str(path), *self.config.args]
            log.info("starting %s", " ".join(argv))
            env = None if self.config.env is None else {**os.environ, **self.config.env}
            # stderr is inherited: the core's logs go where the shim's go, never to stdout.
            # Its stdout is a pipe of our own, read by _CoreStdout (see _read).
            out_r, out_w = os.pipe()
            try:
                proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=out_w, env=env)
            except BaseException:
                os.close(out_r)
                raise
            finally:
                os.close(out_w)
        except ShimError as exc:
            self._startup_failed(exc)
            return None
        except OSError as exc:
            self._startup_failed(ShimError("core_unavailable", f"could not start wisp-core: {exc}. {BUILD_HINT}"))
            return None
        self._starting = proc
        gen = _Generation(proc)
        gen.stdout_fd = out_r
        gen.reader = asyncio.get_running_loop().create_task(self._read(gen), name="wisp-core reader")
        try:
            done, _ = await asyncio.wait({gen.ready, gen.reader}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._starting = None
            await _stop_process(proc)
            raise
        if gen.ready.done() and gen.ready.exception() is None:
            ready = gen.ready.result()
            self._starting = None
            self._gen = gen
            self._startup_error = None
            self.ready_info = ready
            log.info("wisp-core ready: pid %d, backend %s, model %s", ready.pid, ready.backend, ready.model)
            gen.watchdog = asyncio.get_running_loop().create_task(self._watch(gen), name="wisp-core watchdog")
            self._notify()
            return gen
        # Died or hung before Ready: nothing was running on it, so nothing was lost.
        detail = "it exited before it was ready" if done else f"it did not say it was ready within {READY_TIMEOUT_S:.0f} s"
        await _stop_process(proc)
        try:
            rc, reason = await gen.reader
        except Exception:
            rc, reason = proc.returncode, None
        self._starting = None
        why = f" ({reason})" if reason else ""
        self._startup_failed(
            ShimError(
                "core_unavailable",
                f"wisp-core could not start: {detail}, exit status {rc}{why}. Its log on the MCP server's stderr says "
                "why; `python -m wisp_shim --check` runs the same start by hand.",
            )
        )
        return None

    def _startup_failed(self, exc: ShimError) -> None:
        log.error("%s", exc.message)
        self._startup_error = exc
        self._notify()

    async def _read(self, gen: _Generation) -> tuple[int | None, str | None]:
        """The one reader of the core's stdout: resolves calls by id until EOF.

        A protocol on the pipe rather than a loop over asyncio's StreamReader: each reply is
        decoded and its caller's future resolved in the event loop's own read callback. The
        StreamReader path (subprocess transport -> call_soon -> StreamReader -> reader task ->
        future) cost two more event-loop iterations per call, ~40 us of a ~110 us round trip.
        """
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[str | None] = loop.create_future()
        transport, _ = await loop.connect_read_pipe(
            lambda: _CoreStdout(self, gen, ended), os.fdopen(gen.stdout_fd, "rb", buffering=0)
        )
        try:
            reason = await ended
        finally:
            transport.close()
        if reason is not None:
            log.error("protocol error from wisp-core: %s; killing it", reason)
            with contextlib.suppress(ProcessLookupError):
                gen.proc.kill()
        if not gen.ready.done():
            gen.ready.set_exception(ShimError("core_unavailable", reason or "exited before ready"))
            gen.ready.exception()  # mark retrieved
        rc = await gen.proc.wait()
        return rc, reason

    def _dispatch(self, gen: _Generation, msg: p.Incoming) -> None:
        if isinstance(msg, p.Reply):
            call = gen.pending.get(msg.id)
            if call is None:
                if gen.ping is not None and gen.ping[0] == msg.id:
                    gen.ping = None
                else:
                    # A reply to a call we gave up on (cancelled) or to a cancel.
                    log.debug("reply for request %d nobody waits for", msg.id)
                return
            result = None
            if msg.ok:
                # A result that does not decode is a broken frame like any other: the ProtocolError
                # ends this core (the stream cannot be trusted, nor the shim's view of its threads),
                # and every pending call, this one included, fails as in a crash.
                result = p.decode_result(msg.result, call.result_type)
                self._track(gen, result)
            # An error reply goes to its caller as it is. That includes the core's invalid_argument
            # for a request frame it could read an id from but not decode as an op: such a frame is
            # the shim's own bug, not a sign that the core is broken, and restarting the core for it
            # would lose every thread without fixing anything.
            del gen.pending[msg.id]
            target = call.future if not call.future.done() else call.late
            if target is not None and not target.done():
                target.set_result((msg, result))
        elif isinstance(msg, p.Progress):
            call = gen.pending.get(msg.id)

            if call is not None and call.progress_event is not None:
                call.latest = (msg.tokens, msg.text)
                call.progress_event.set()
        elif isinstance(msg, p.Evicted):
            gen.alive.pop(msg.thread_id, None)  # gone already: a later crash did not lose it
        elif isinstance(msg, p.Ready):
            if gen.ready.done():
                raise p.ProtocolError("a second ready frame")
            if msg.protocol != p.PROTOCOL_VERSION:
                raise p.ProtocolError(f"wisp-core speaks pipe protocol {msg.protocol}, this shim speaks {p.PROTOCOL_VERSION}; rebuild both (`make build`)")
            gen.ready.set_result(msg)
        if not gen.ready.done():
            raise p.ProtocolError("the first frame was not ready")

    @staticmethod
    def _track(gen: _Generation, result: msgspec.Struct) -> None:
        """The shim's view of the core's live threads, updated in frame order: an eviction
        or a close that the core sent after this reply must win over it."""
        if isinstance(result, p.RespondResult):
            durable = gen.ready.done() and gen.ready.result().durable
            if durable and result.store_error is None:
                # Stored: a crash from here on loses nothing of it.
                gen.alive.pop(result.thread_id, None)
            # A thread closed or evicted while this call ran is not alive again because the call finished.
            elif durable or result.created or result.thread_id in gen.alive:
                gen.remember(result.thread_id)
        elif isinstance(result, p.CloseThreadResult):
            gen.alive.pop(result.thread_id, None)

    async def _watch(self, gen: _Generation) -> None:
        """Restart a core that stopped answering while calls wait on it (see PING_AFTER_S)."""
        while not gen.dead:
            await asyncio.sleep(WATCHDOG_TICK_S)
            if gen.dead:
                return
            now = time.monotonic()
            if not gen.pending:
                gen.ping = None  # nobody waits: an idle core may be as slow as it likes
                continue
            if gen.ping is not None and gen.last_frame >= gen.ping[1]:
                gen.ping = None  # it said something since: alive
            if gen.ping is None:
                if now - max(gen.last_frame, gen.last_send) >= PING_AFTER_S:
                    ping_id = self._new_id()
                    gen.ping = (ping_id, now)
                    self._write(gen, p.encode(p.Ping(id=ping_id)))
                continue
            if now - gen.ping[1] >= PING_TIMEOUT_S:
                gen.fault = (
                    f"stopped answering: no reply to a liveness ping within {PING_TIMEOUT_S:g} s while "
                    f"{len(gen.pending)} call(s) waited, so wisp stopped it"
                )
                log.error("wisp-core (pid %d) %s", gen.proc.pid, gen.fault)
                await _terminate(gen.proc)
                return

    async def _serve(self, gen: _Generation) -> tuple[int | None, str | None]:
        reader = gen.reader
        assert reader is not None
        try:
            return await asyncio.shield(reader)
        except asyncio.CancelledError:
            if reader.done():
                return reader.result()
            raise

    def _on_death(self, gen: _Generation, rc: int | None, reason: str | None) -> None:
        gen.dead = True
        self._gen = None
        if gen.watchdog is not None:
            gen.watchdog.cancel()
        if gen.fault:
            how = gen.fault
        elif reason:
            how = f"was stopped after a protocol error ({reason})"
        elif rc is not None and rc >= 0:
            how = f"exited with status {rc}"
        else:
            how = f"was killed by signal {-(rc or 0)}"
        notified = {c.thread_id for c in gen.pending.values() if c.thread_id}
        durable = gen.ready.done() and gen.ready.exception() is None and gen.ready.result().durable
        for call in list(gen.pending.values()):
            if call.thread_id and durable and call.thread_id not in gen.alive:
                tail = (
                    f"Thread {call.thread_id!r} is stored: call respond again with it to continue from its last stored "
                    "turn (this call's turn is in it only if it was stored just before the crash: `turns` tells)."
                )
            elif call.thread_id:
                tail = (
                    f"Thread {call.thread_id!r}'s history was lost with it: call respond again "
                    "(with the same thread_id or none) to start a new thread."
                )
            else:
                tail = "No thread was created for this call: call respond again to start one."
            self._fail(call, ShimError("core_crashed", f"the wisp core crashed ({how}) while this call was running and has been restarted. {tail}"))
        gen.pending.clear()
        # Callers whose own call failed above were told already; everyone else
        # learns on their next call.
        # With a state dir, `alive` holds only threads whose latest turn could not be stored.
        lost = [t for t in gen.alive if t not in notified]
        for t in lost:
            self.lost[t] = None
        while len(self.lost) > MAX_REMEMBERED_IDS:
            self.lost.popitem(last=False)
        log.error("wisp-core %s; %d pending call(s) failed, %d thread(s) lost", how, len(notified), len(gen.alive))
        self._notify()

    @staticmethod
    def _fail(call: _Call, exc: ShimError) -> None:
        for fut in (call.future, call.late):
            if fut is not None and not fut.done():
                fut.set_exception(exc)
                fut.exception()  # the waiter may already be gone; don't warn about it

    def _fail_pending(self, gen: _Generation, exc: ShimError) -> None:
        for call in list(gen.pending.values()):
            self._fail(call, exc)
        gen.pending.clear()

    async def _generation(self) -> _Generation:
        """The running core, waiting for a (re)start if needed."""
        while True:
            if self._closing:
                raise ShimError("shutting_down", "wisp is shutting down.")
            gen = self._gen
            if gen is not None and not gen.dead:
                return gen
            if self._supervisor is None:
                self.start()
            changed = self._changed
            if self._startup_error is not None and self._starting is None:
                # A failed start is retried when someone needs the core, not only on a timer,
                # so building the binary while the server runs is enough to fix it.
                self._kick.set()
            await changed.wait()
            if self._gen is None and self._startup_error is not None and self._starting is None:
                raise self._startup_error

    # --- calls -------------------------------------------------------------

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    @staticmethod
    def _write(gen: _Generation, data: bytes) -> None:
        """Queue a whole frame for the core without waiting for it to be read.

        Never waiting is what lets a time limit, a cancel or a ping go out to a core that has
        stopped reading; what can queue here is bounded by the MCP layer's in-flight limits
        (transport.py: 128 calls, 64 MiB), not by the core."""
        stdin = gen.proc.stdin
        if gen.dead or stdin is None:
            return
        gen.last_send = time.monotonic()
        try:
            stdin.write(data)
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as exc:
            # The reader sees the exit too and fails every pending call with the crash message.
            log.warning("write to wisp-core failed: %s", exc)

    def _send_cancel(self, gen: _Generation, request_id: int) -> None:
        self._write(gen, p.encode(p.Cancel(id=self._new_id(), request=request_id)))

    async def _request(self, gen: _Generation, call: _Call, data: bytes, timeout: float,
                       on_timeout: Callable[[], ShimError],
                       on_progress: Callable[[int, str], Awaitable[None]] | None = None) -> _Answer:
        if gen.dead:
            raise ShimError("core_crashed", "the wisp core crashed just before this call was sent and is restarting; call again.")
        gen.pending[call.id] = call
        # A timer handle rather than asyncio.wait_for: this path is on every call's round trip.
        timer = asyncio.get_running_loop().call_later(timeout, _expire, call)
        pump = None
        if on_progress is not None and call.progress_event is not None:
            pump = asyncio.get_running_loop().create_task(_pump_progress(call, on_progress))
        try:
            try:
                # Inside the try: once the frame may be queued, a cancellation must reach the core.
                self._write(gen, data)
                answer = await call.future
            except _Expired:
                answer = await self._after_expiry(gen, call, on_timeout)
            except asyncio.CancelledError:
                # MCP cancellation: tell the core so the thread is freed, then let it propagate.
                self._send_cancel(gen, call.id)
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
            gen.pending.pop(call.id, None)
            if pump is not None:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump

    async def _after_expiry(self, gen: _Generation, call: _Call, on_timeout: Callable[[], ShimError]) -> _Answer:
        """The time limit passed: cancel the call in the core and give its own reply a moment.
        A success (or a real failure) that beat the cancel is the call's outcome; the core's
        own `timeout` or `cancelled` answer, or silence, is the shim's timeout error."""
        late = call.late
        assert late is not None  # made by _expire
        self._send_cancel(gen, call.id)
        try:
            reply, result = await asyncio.wait_for(late, CANCEL_GRACE_S)
        except asyncio.TimeoutError:
            raise on_timeout() from None
        if not reply.ok and reply.error is not None and reply.error.code in ("timeout", "cancelled"):
            raise on_timeout()
        return reply, result

    async def respond(
        self,
        prompt: str,
        thread_id: str | None = None,
        instructions: str | None = None,
        tools: list[str] | None = None,
        temperature: float | None = None,
        max_output_tokens: int | None = None,
        on_progress: Callable[[int, str], Awaitable[None]] | None = None,
        roots: list[str] | None = None,
        files: list[str] | None = None,
        schema: str | None = None,
    ) -> p.RespondResult:
        if thread_id is not None and thread_id in self.lost:
            del self.lost[thread_id]
            raise ShimError(
                "thread_lost",
                f"thread {thread_id!r}'s history was lost when the wisp core crashed and restarted. "
                "Nothing was sent to the model. Call respond again (with the same thread_id or none) to start "
                "a new thread, and resend whatever context it needs.",
            )
        limit = self.config.timeout_s
        gen = await self._generation()
        call_id = self._new_id()
        # The core gets the same limit, so that it can refuse to commit a turn that finishes late.
        options = p.RespondOptions(temperature=temperature, max_output_tokens=max_output_tokens, timeout_s=limit)
        msg = p.Respond(
            id=call_id, prompt=prompt, thread_id=thread_id, instructions=instructions, tools=tools,
            options=options, progress=True if on_progress is not None else None, roots=roots or None,
            files=files or None,
            schema=schema,
        )
        payload = p.encode_payload(msg)
        if len(payload) > p.MAX_FRAME_BYTES:
            raise ShimError(
                "invalid_argument",
                f"the request is {len(payload)} bytes, over wisp's {p.MAX_FRAME_BYTES // (1024 * 1024)} MiB limit; "
                "send a shorter prompt (or split the work across several calls).",
            )

        def timed_out() -> ShimError:
            left = f"thread {thread_id!r} is unchanged" if thread_id is not None else "no thread was created"
            return ShimError(
                "timeout",
                f"no reply within {limit:g} s; the call was stopped and {left}. "
                "(--timeout / WISP_TIMEOUT sets the limit for respond.)",
            )

        call = _Call(call_id, thread_id, on_progress is not None, p.RespondResult)
        started = time.monotonic()
        reply, result = await self._request(gen, call, p.frame(payload), limit, timed_out, on_progress)
        if not reply.ok:
            assert reply.error is not None
            error = ShimError(reply.error.code, reply.error.message)
            if self.config.explain is not None:
                error = await self.config.explain(error, started)
            raise error
        assert isinstance(result, p.RespondResult)
        return result

    async def close_thread(self, thread_id: str) -> p.CloseThreadResult:
        # Closing a lost thread is what the caller would do anyway: no notice needed.
        self.lost.pop(thread_id, None)
        gen = await self._generation()
        call = _Call(self._new_id(), thread_id, False, p.CloseThreadResult)
        frame = p.encode(p.CloseThread(id=call.id, thread_id=thread_id))
        reply, result = await self._request(gen, call, frame, QUICK_CALL_TIMEOUT_S, _quick_timeout("close_thread"))
        if not reply.ok:
            assert reply.error is not None
            raise ShimError(reply.error.code, reply.error.message)
        assert isinstance(result, p.CloseThreadResult)
        return result

    async def status(self) -> p.StatusResult:
        gen = await self._generation()
        call = _Call(self._new_id(), None, False, p.StatusResult)
        reply, result = await self._request(gen, call, p.encode(p.Status(id=call.id)), QUICK_CALL_TIMEOUT_S, _quick_timeout("status"))
        if not reply.ok:
            assert reply.error is not None
            raise ShimError(reply.error.code, reply.error.message)
        assert isinstance(result, p.StatusResult)
        return result

    @property
    def pid(self) -> int | None:
        gen = self._gen
        return gen.proc.pid if gen is not None else None


class _Expired(Exception):
    """The shim's own time limit for a call passed before the core replied."""


def _expire(call: _Call) -> None:
    if not call.future.done():
        # Before the waiter wakes: a reply arriving in between must find somewhere to land.
        call.late = asyncio.get_running_loop().create_future()
        call.future.set_exception(_Expired())


def _quick_timeout(op: str) -> Callable[[], ShimError]:
    return lambda: ShimError("timeout", f"wisp-core did not answer `{op}` within {QUICK_CALL_TIMEOUT_S:g} s; call again.")


class _CoreStdout(asyncio.Protocol):
    """The core's stdout: frames are dispatched as they arrive. `ended` gets None at EOF,
    or the reason the stream can no longer be trusted."""

    def __init__(self, core: Core, gen: _Generation, ended: asyncio.Future[str | None]) -> None:
        self._core = core
        self._gen = gen
        self._ended = ended
        self._decoder = p.FrameDecoder()

    def data_received(self, data: bytes) -> None:
        if self._ended.done():
            return
        self._gen.last_frame = time.monotonic()
        try:
            for payload in self._decoder.feed(data):
                self._core._dispatch(self._gen, p.decode_message(payload))
        except p.ProtocolError as exc:
            self._ended.set_result(str(exc))

    def connection_lost(self, exc: Exception | None) -> None:
        if self._ended.done():
            return
        try:
            self._decoder.finish()
        except p.ProtocolError as err:
            self._ended.set_result(str(err))
            return
        self._ended.set_result(None)


async def _pump_progress(call: _Call, on_progress: Callable[[int, str], Awaitable[None]]) -> None:
    """Forward the latest partial text, strictly increasing in tokens and rate-limited;
    once the reply is in, send what is left and stop."""
    assert call.progress_event is not None and call.answered is not None
    while True:
        await call.progress_event.wait()
        call.progress_event.clear()
        if call.latest is not None and call.latest[0] > call.sent:
            tokens, text = call.latest
            try:
                await on_progress(tokens, text)
            except Exception as exc:  # a progress hiccup must not fail the call itself
                log.debug("progress notification failed: %s", exc)
            call.sent = tokens
        if call.answered.is_set():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(call.answered.wait(), PROGRESS_INTERVAL_S)


def _signal(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


async def _wait(proc: asyncio.subprocess.Process, grace: float | None) -> bool:
    try:
        await asyncio.wait_for(proc.wait(), grace)
        return True
    except asyncio.TimeoutError:
        return False


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL. SIGCONT goes with the SIGTERM: a stopped process (SIGSTOP) keeps
    a SIGTERM pending until it runs again, and only SIGKILL or SIGCONT can change that."""
    if proc.returncode is not None:
        return
    _signal(proc, signal.SIGTERM)
    _signal(proc, signal.SIGCONT)
    if not await _wait(proc, TERM_GRACE_S):
        _signal(proc, signal.SIGKILL)
        await _wait(proc, None)


async def _stop_process(proc: asyncio.subprocess.Process) -> None:
    """Close the core's stdin (a healthy core exits at EOF), then _terminate."""
    if proc.returncode is not None:
        return
    if proc.stdin is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
    # No signal yet: Popen.send_signal polls first, and that can reap a core that is just
    # exiting under asyncio's child watcher, which then reports status 255. A stopped core,
    # which cannot see the EOF, gets its SIGCONT with the SIGTERM.
    if not await _wait(proc, EOF_GRACE_S):
        await _terminate(proc)
