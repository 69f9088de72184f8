"""Every error code a wisp tool error can carry, and ShimError, the exception that carries one.

A tool error reads `code: message`. The core's codes come in its error replies (the core
states them, facts.CORE_CODES; the names below are the ones the shim acts on, each one of
them); the shim adds its own for what only it can see: the core process itself failing, or
the shim stopping.
"""

from __future__ import annotations

from typing import Any

from .facts import CORE_CODES

# --- the core's codes that the shim names --------------------------------------------------
INVALID_ARGUMENT = "invalid_argument"
CONTEXT_OVERFLOW = "context_overflow"
MODEL_UNAVAILABLE = "model_unavailable"
GENERATION_FAILED = "generation_failed"
INVALID_OUTPUT = "invalid_output"
# A reply over the pipe's frame limit once encoded; its turn was not kept.
REPLY_TOO_LARGE = "reply_too_large"
CANCELLED = "cancelled"
TIMEOUT = "timeout"
BUSY = "busy"
INTERNAL = "internal"

NAMED_CORE_CODES = frozenset(
    {
        INVALID_ARGUMENT,
        CONTEXT_OVERFLOW,
        MODEL_UNAVAILABLE,
        GENERATION_FAILED,
        INVALID_OUTPUT,
        REPLY_TOO_LARGE,
        CANCELLED,
        TIMEOUT,
        BUSY,
        INTERNAL,
    }
)
assert NAMED_CORE_CODES <= CORE_CODES, NAMED_CORE_CODES - CORE_CODES

# --- the shim's own -------------------------------------------------------------------------
# The core died while the call ran (or just before it was sent); it has been restarted.
CORE_CRASHED = "core_crashed"
# The thread named was in a core that crashed and was not stored: its history is gone.
THREAD_LOST = "thread_lost"
# No wisp-core binary where --core / WISP_CORE or the search path says.
CORE_MISSING = "core_missing"
# A wisp-core binary exists but would not start, or did not say it was ready.
CORE_UNAVAILABLE = "core_unavailable"
# The shim is stopping (a signal, or the client closed stdin).
SHUTTING_DOWN = "shutting_down"

SHIM_CODES = frozenset({CORE_CRASHED, THREAD_LOST, CORE_MISSING, CORE_UNAVAILABLE, SHUTTING_DOWN})

# Failures of the model itself, which the local-model layer may explain further.
MODEL_CODES = (MODEL_UNAVAILABLE, GENERATION_FAILED)


class ShimError(Exception):
    """A failure the caller should see as a tool error: `code: message`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class CoreRefused(ShimError):
    """A core that started and said it was ready, but that this shim will not use (another
    version: version.mismatch says why): restarting it cannot help, a rebuild or reinstall can."""

    def __init__(self, message: str) -> None:
        super().__init__(CORE_UNAVAILABLE, message)


# How every message quotes a value from outside (an argument, an id, a URI): one judgement of it.
def short(value: Any) -> str:
    """A value as an error message may quote it: never long, never slow."""
    if _huge(value):
        # repr of a huge int is slow, and past 4,300 digits refused by Python itself.
        return f"an integer of {_digits(value)} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _huge(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200


def _digits(n: int) -> str:
    """How many decimal digits |n| has, exactly, without writing it out: 2**(b-1) <= |n| < 2**b
    leaves two candidates, told apart by one power of ten (past a million bits, an estimate)."""
    bits = abs(n).bit_length()
    low = int((bits - 1) * 0.30102999566398120)  # floor(log10 |n|) is low or low + 1
    if bits > 1_000_000:
        return f"about {low + 1:,}"
    return f"{low + 2 if abs(n) >= 10 ** (low + 1) else low + 1:,}"


def got(value: Any) -> str:
    """A wrong value as `got …` names it: its type and its text, or what a huge integer is."""
    return short(value) if _huge(value) else f"{type(value).__name__} {short(value)}"
