"""The shim's event loop: asyncio's, with a selector that polls briefly before it sleeps
while a reply from a busy wisp-core is due.

Why: on the 2-vCPU VMs wisp is measured on, a process that sleeps in epoll and is woken by
the core's reply waits for its vCPU to come back from idle, longer than the core takes to
answer an echo call. So when the shim has just written a frame to a core that was busy a
moment ago (HOT_S) and has nothing else to run, it looks at its file descriptors without
sleeping for up to SPIN_S before it sleeps as usual. It shortens `make bench`'s
back-to-back pipe round trip (`pipe_p50_us`; the figures are in bench/README.md). The cost is
at most SPIN_S of CPU per frame sent, only when the shim is otherwise idle, and nothing while
it waits for a model, which answers long after the window closes.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from typing import Any, Callable, TypeVar

P = TypeVar("P", bound=asyncio.BaseProtocol)

# How long the loop polls before sleeping after a frame went to the core: several echo
# round trips, a small share of any model call.
SPIN_S = 250e-6
# Only while the core wrote something this recently: a core idle for longer sits on a vCPU the
# hypervisor has put to sleep, and polling here then keeps this vCPU busy, so the kernel must
# wake the core on that sleeping one: with idle time between calls, polling made them slower
# (`pipe_idle_p50_us` in bench/). A busy core's vCPU is still awake, and there
# polling wins.
HOT_S = 200e-6
# asyncio reads a pipe into a fresh 256 KiB buffer, above malloc's mmap threshold: every read
# cost an mmap, an mremap to shrink the buffer to what came and a munmap (and a page fault).
# The shim's pipe transports (the core's stdout, stdio's stdin) read this much at a time, a
# buffer that comes from the heap; a large message just takes more reads.
PIPE_READ_CHUNK = 64 * 1024


class SpinSelector(selectors.DefaultSelector):
    """The platform's default selector, polling without sleeping until `spin_until`."""

    def __init__(self) -> None:
        super().__init__()
        self.spin_until = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self.spin_until and (timeout is None or timeout > 0):
            now = time.monotonic()
            end = self.spin_until if timeout is None else min(self.spin_until, now + timeout)
            start = now
            while now < end:
                ready = super().select(0)
                if ready:
                    return ready
                now = time.monotonic()
            self.spin_until = 0.0
            if timeout is not None:
                timeout = max(0.0, timeout - (now - start))
        return super().select(timeout)


class WispEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop on a SpinSelector."""

    def __init__(self) -> None:
        self.spinner = SpinSelector()
        super().__init__(self.spinner)


def spin_for_reply(core_idle_s: float) -> None:
    """A frame went to the core, which last wrote `core_idle_s` ago: while it is hot, poll
    before sleeping for the next SPIN_S (on wisp's loop; elsewhere, as in tests on another
    loop, nothing changes)."""
    if core_idle_s > HOT_S:
        return
    loop = asyncio.get_running_loop()
    if isinstance(loop, WispEventLoop):
        loop.spinner.spin_until = time.monotonic() + SPIN_S


async def connect_read_pipe(
    loop: asyncio.AbstractEventLoop, protocol_factory: Callable[[], P], pipe: Any
) -> tuple[asyncio.ReadTransport, P]:
    """`loop.connect_read_pipe`, reading PIPE_READ_CHUNK at a time. The read size is the
    `max_size` attribute of asyncio's Unix read-pipe transport, no API: this is its one use,
    and tests/python/test_loop.py fails by name if a Python release drops it."""
    transport, protocol = await loop.connect_read_pipe(protocol_factory, pipe)
    transport.max_size = PIPE_READ_CHUNK  # type: ignore[attr-defined]
    return transport, protocol
