"""`make bench`'s `wheel` section: the wheel `make wheel` wrote to dist/, installed into a fresh
venv outside the checkout (no PYTHONPATH, no swift on PATH), as a user of `pip install` has it.

  wheel_bytes                   the wheel's size
  core_binary_bytes             the static core inside it, as installed
  wheel_start_ratio             spawn until `initialize` is answered, the installed `wisp-mcp` /
                                the checkout's `python -m wisp_shim` (its dynamic core), started
                                in turn, medians: what Codex's 10 s start limit sees
  static_core_roundtrip_ratio   respond p50 through the checkout's shim, with the wheel's static
                                core / with the dynamic .build/release core, both connected at
                                once and called in turn: what the static link costs per call
                                (echo: no model server, so wisp's HTTP client is not in it)
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
from harness.wheel import built_wheel, clean_env  # noqa: E402

from clients import BIG_CONTEXT, CORE, PY, REPO, RawClient, interleaved_times, log, mcp_client, median, wisp_argv

WHEEL_TARGETS = {
    "wheel_bytes": (15_000_000, "max"),
    "wheel_start_ratio": (1.1, "max"),
    "static_core_roundtrip_ratio": (1.05, "max"),
}
WHEEL_ROWS = [
    ("wheel_bytes", "wheel size (bytes)", "{:,.0f}"),
    ("core_binary_bytes", "  its static core, installed (bytes)", "{:,.0f}"),
    ("wheel_start_ratio", "start to initialize, installed wheel / checkout", "{:.2f}"),
    ("wheel_start_ms", "  installed wheel (ms)", "{:.0f}"),
    ("checkout_start_ms", "  checkout (ms)", "{:.0f}"),
    ("static_core_roundtrip_ratio", "respond p50, static core / dynamic core", "{:.3f}"),
    ("static_core_p50_us", "  static core (us)", "{:.0f}"),
    ("dynamic_core_p50_us", "  dynamic core (us)", "{:.0f}"),
]


def _install(wheel: Path, root: Path) -> tuple[Path, Path]:
    """A fresh venv with the wheel in it: (its bin directory, the core it installed)."""
    venv = root / "venv"
    subprocess.run([PY, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)], check=True)
    found = subprocess.run([str(py), "-c", "import wisp_shim, pathlib; print(pathlib.Path(wisp_shim.__file__).parent)"],
                           check=True, capture_output=True, text=True, cwd=root, env=clean_env(venv / "bin", root))
    core = Path(found.stdout.strip()) / "bin" / "wisp-core"
    if not core.is_file():
        raise RuntimeError(f"the installed wheel has no core at {core}")
    return venv / "bin", core


async def _start(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    c = await RawClient.spawn(argv, env=env, cwd=cwd)
    try:
        await c.initialize()
        return time.perf_counter() - t
    finally:
        await c.close()


async def _starts(bindir: Path, home: Path, repeats: int) -> dict[str, Any]:
    import compileall

    # The checkout's .pyc files written first, as pip wrote the wheel's at install.
    compileall.compile_dir(str(REPO / "python" / "wisp_shim"), quiet=1)
    wheel_argv = [str(bindir / "wisp-mcp"), "--backend", "echo", "--context-size", BIG_CONTEXT]
    checkout_argv = wisp_argv()
    wheel_env, checkout_env = clean_env(bindir, home), None
    await _start(wheel_argv, wheel_env, home)  # page cache and .pyc files warm for both
    await _start(checkout_argv, checkout_env, REPO)
    runs = []
    for _ in range(repeats):
        w = await _start(wheel_argv, wheel_env, home)
        c = await _start(checkout_argv, checkout_env, REPO)
        runs.append({"wheel_ms": w * 1e3, "checkout_ms": c * 1e3, "ratio": w / c})
    log("wheel start: " + ", ".join(f"{x['wheel_ms']:.0f}/{x['checkout_ms']:.0f} ms" for x in runs))
    return {
        "wheel_start_ratio": median(x["ratio"] for x in runs),
        "wheel_start_ms": median(x["wheel_ms"] for x in runs),
        "checkout_start_ms": median(x["checkout_ms"] for x in runs),
        "_runs": {"wheel_start": runs},
    }


async def _roundtrips(static_core: Path, calls: int, repeats: int) -> dict[str, Any]:
    static_argv = [PY, "-m", "wisp_shim", "--core", str(static_core), "--backend", "echo", "--context-size", BIG_CONTEXT]
    runs = []
    for r in range(repeats):
        async with mcp_client(wisp_argv()) as dynamic, mcp_client(static_argv) as static:
            clients = {"dynamic": dynamic, "static": static}
            args: dict[str, dict[str, str]] = {}
            for name, c in clients.items():
                first = await c.call_tool("respond", {"prompt": "hello"})
                assert not first.is_error, first
                args[name] = {"prompt": "ping", "thread_id": first.structured_content["thread_id"]}
            times = await interleaved_times(clients, args, calls)
        run = {f"{k}_p50_us": median(v) * 1e6 for k, v in times.items()}
        run["ratio"] = run["static_p50_us"] / run["dynamic_p50_us"]
        runs.append(run)
        log(f"static core {r + 1}/{repeats}: p50 static {run['static_p50_us']:.0f} us, "
             f"dynamic {run['dynamic_p50_us']:.0f} us; ratio {run['ratio']:.3f}")
    return {
        "static_core_roundtrip_ratio": median(x["ratio"] for x in runs),
        "static_core_p50_us": median(x["static_p50_us"] for x in runs),
        "dynamic_core_p50_us": median(x["dynamic_p50_us"] for x in runs),
        "_runs": {"static_core": runs},
    }


async def wheel_section(quick: bool) -> dict[str, Any]:
    wheel = built_wheel()
    if wheel is None:
        why = "no wheel in dist/ (`make wheel` builds it, on Linux)"
        log(f"wheel: skipped: {why}")
        return {"wheel_reason": why}
    if not CORE.is_file():
        return {"wheel_reason": f"no dynamic core at {CORE} to compare with (`make build`)"}
    root = Path(tempfile.mkdtemp(prefix="wisp-bench-wheel-"))
    try:
        bindir, core = await asyncio.to_thread(_install, wheel, root)
        out: dict[str, Any] = {"wheel_bytes": wheel.stat().st_size, "core_binary_bytes": core.stat().st_size}
        starts = await _starts(bindir, root, repeats=3 if quick else 15)
        trips = await _roundtrips(core, calls=100 if quick else 400, repeats=1 if quick else 5)
        runs = {**starts.pop("_runs"), **trips.pop("_runs")}
        return {**out, **starts, **trips, "_runs": runs}
    finally:
        shutil.rmtree(root, ignore_errors=True)
