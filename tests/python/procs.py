"""Process inspection for the tests, through psutil, so that it means the same on Linux and
macOS (reading /proc would find nothing on a Mac, and an orphan check would then pass without
checking anything). A zombie counts as gone: it has exited, only its parent's bookkeeping is left."""

from __future__ import annotations

import time

import psutil


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def running(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return _alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def children(pid: int) -> list[int]:
    """The running direct children of `pid`, oldest first."""
    try:
        kids = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return []
    alive = [k for k in kids if _alive(k)]
    return [k.pid for k in sorted(alive, key=lambda k: (k.create_time(), k.pid))]


def ppid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.NoSuchProcess:
        return None


def grandchildren_named(pid: int, suffix: str) -> set[int]:
    """Running processes whose executable name ends with `suffix` and whose parent is a child
    of `pid` (e.g. the llama-servers of the shims this test process started)."""
    found = set()
    for shim in children(pid):
        try:
            kids = psutil.Process(shim).children()
        except psutil.NoSuchProcess:
            continue
        for k in kids:
            try:
                argv0 = (k.cmdline() or [""])[0]
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if argv0.endswith(suffix) and _alive(k):
                found.add(k.pid)
    return found


def rss_kib(pid: int | None) -> int:
    """Resident memory in KiB; 0 for a process that is gone (or None)."""
    if pid is None:
        return 0
    try:
        return psutil.Process(pid).memory_info().rss // 1024
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.05)
    return not running(pid)
