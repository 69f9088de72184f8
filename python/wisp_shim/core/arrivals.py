"""Calls on one thread reach the core in the order they reached the shim (docs/threads.md).

The core queues a thread's calls in the order their frames arrive, but a call may wait in the
shim before its frame is written: a call that binds tools or attaches files first asks the MCP
client for its roots. A later call on the same thread that needs no roots would overtake it. So a
call takes its place here when it arrives, before anything it awaits, and its frame is written
only once every call that arrived before it on its thread has written its own or given up.
"""

from __future__ import annotations

import asyncio


class Place:
    """A call's place in its thread's line of arrivals. `leave` once it is sent or will not be
    (refused, cancelled, failed): the next call's turn then comes once every call ahead of this
    one has left too. Leaving twice is leaving once."""

    def __init__(self, line: Arrivals | None, key: str | None, ahead: asyncio.Future[None] | None) -> None:
        self._line, self._key, self._ahead = line, key, ahead
        self._leaving = line is None  # a call on no thread holds no one back: nothing to leave
        self.left: asyncio.Future[None] | None = None if line is None else asyncio.get_running_loop().create_future()

    @property
    def behind(self) -> bool:
        """Whether a call that arrived before this one on its thread has not left yet."""
        return self._ahead is not None and not self._ahead.done()

    async def turn(self) -> None:
        """Returns when every call that arrived before this one on its thread has left."""
        if self._ahead is not None and self.behind:
            await asyncio.shield(self._ahead)  # this call's cancel must not cancel the one ahead

    def leave(self) -> None:
        if self._leaving:
            return
        self._leaving = True
        if self._ahead is not None and self.behind:
            # A call that gives up early still holds back those behind it until the ones ahead left.
            self._ahead.add_done_callback(lambda _: self._left())
        else:
            self._left()

    def _left(self) -> None:
        assert self.left is not None and self._line is not None and self._key is not None
        self.left.set_result(None)
        self._line.forget(self._key, self.left)


class Arrivals:
    """The line of arrivals of each thread that has calls not yet sent."""

    def __init__(self) -> None:
        self._last: dict[str, asyncio.Future[None]] = {}

    def arrive(self, thread_id: str | None) -> Place:
        """A place behind the calls that arrived on `thread_id` before; a call that names no
        thread starts a new one, which no other call can name yet: it waits for none."""
        if thread_id is None:
            return Place(None, None, None)
        place = Place(self, thread_id, self._last.get(thread_id))
        assert place.left is not None
        self._last[thread_id] = place.left
        return place

    def forget(self, thread_id: str, left: asyncio.Future[None]) -> None:
        """Drops the thread's line once its last call has left (the dict holds only live lines)."""
        if self._last.get(thread_id) is left:
            del self._last[thread_id]

    def __len__(self) -> int:
        return len(self._last)
