"""A call's progress as the client forwards it: what the call waits for (the core's Stage) or
the latest partial reply, rate-limited, and the same again with the time waited when nothing new
comes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ..facts import PROGRESS_INTERVAL_S
from .pending import PendingCall

log = logging.getLogger("wisp.core")

# Called with a strictly increasing count, what the call is doing for a person to read, and the
# tail of the partial reply so far ("" while waiting).
OnProgress = Callable[[int, str, str], Awaitable[None]]


def describe_stage(stage: tuple[str, int | None] | None) -> str:
    """What a call waits for (the core's Stage), in words for a tool row."""
    what, count = stage if stage is not None else ("queue", 0)
    if what == "queue" and count:
        return f"queued behind {count} call{'s' if count != 1 else ''} on this thread"
    if what == "slot":
        return "waiting for a model slot (all are busy with other threads)"
    if what == "prompt":
        return f"reading the prompt: about {count:,} tokens" if count else "reading the prompt"
    return "waiting for the model"


def _writing(latest: tuple[int, int, str]) -> tuple[str, str]:
    """What a call that is writing says: its tokens and characters so far, and its preview."""
    tokens, chars, preview = latest
    return f"writing: {tokens:,} tokens, {chars:,} characters", preview


async def pump_progress(call: PendingCall, on_progress: OnProgress, every_s: float) -> None:
    """Forward what the call is doing: the latest partial text (its tokens strictly increasing,
    rate-limited) or what it waits for, and, when nothing new came for `every_s`, the same again
    with the time waited; once the reply is in, send what is left and stop."""
    assert call.progress_event is not None and call.answered is not None
    loop = asyncio.get_running_loop()
    started = last = loop.time()
    count = 0
    shown: tuple[str, int | None] | None = None
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(call.progress_event.wait(), max(0.0, last + every_s - loop.time()))
        call.progress_event.clear()
        status = text = None
        if call.newest == "text" and call.latest is not None and call.latest[0] > call.sent:
            status, text = _writing(call.latest)
            call.sent = call.latest[0]
        elif call.newest == "stage" and call.stage != shown and not call.answered.is_set():
            shown = call.stage
            status, text = describe_stage(shown), ""
        elif loop.time() - last >= every_s and not call.answered.is_set():
            if call.newest == "text" and call.latest is not None:
                status, text = _writing(call.latest)
            else:
                status, text = f"{describe_stage(call.stage)} ({loop.time() - started:.0f} s)", ""
        if status is not None:
            count += 1
            last = loop.time()
            try:
                await on_progress(count, status, text or "")
            except Exception as exc:  # a progress hiccup must not fail the call itself
                log.debug("progress notification failed: %s", exc)
        if call.answered.is_set():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(call.answered.wait(), PROGRESS_INTERVAL_S)
