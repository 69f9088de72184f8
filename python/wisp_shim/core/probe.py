"""A core of its own, started for one question (`--check`, the Apple probe) and stopped after it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from .. import errors
from ..errors import ShimError
from . import protocol
from .client import Core
from .process import CoreLaunch

# Its start and the answer together.
PROBE_TIMEOUT_S = 60.0


async def probe_status(launch: CoreLaunch,
                       then: Callable[[], Awaitable[str | None]] | None = None) -> tuple[protocol.StatusResult, str]:
    """The status of a core of its own, started for the question and stopped after it, and the
    binary's path; with `then`, also what it says while the core still runs (None: fine)."""
    core = Core(launch)
    core.start()
    try:
        with anyio.fail_after(PROBE_TIMEOUT_S):
            st = await core.status()
        if then is not None:
            problem = await then()
            if problem:
                st.available, st.reason = False, problem
        return st, str(core.binary)
    except TimeoutError:
        raise ShimError(errors.TIMEOUT, f"wisp-core did not answer `status` within {PROBE_TIMEOUT_S:g} s") from None
    finally:
        with anyio.CancelScope(shield=True):
            await core.aclose()
