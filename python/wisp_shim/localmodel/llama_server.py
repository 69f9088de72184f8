"""Running llama.cpp's server for wisp, compiled or the xllamacpp wheel's (localmodel/llama_install.py):
its command line (slots, context, CPU threads), its process (own process group, PR_SET_PDEATHSIG
on Linux), its key, its log, its health, the restart when it dies, its stop (SIGTERM, then
SIGKILL), how its exit reads in an error, and `verify`: one real decode, which proves a server
computes on this machine.

- The key: every start gets a new random API key, in the server's environment (LLAMA_API_KEY,
  which llama-server and the launcher both read; an environment is readable by its owner only,
  a command line by everyone) and in the core's (WISP_API_KEY). Any other local user's request
  to the port is refused (401); /health alone answers without it.
- The log: the server's stdout and stderr are one pipe that a thread of the shim drains line by
  line into the shim's own bounded log sink (logs.py): a stderr that nobody reads drops lines
  there, and never stalls the server (a server blocked in a log write answers no request).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import config
from .llama_install import NATIVE, XLLAMACPP, LocalModelError, ServerProgram
from .xllamacpp_server import API_KEY_ENV, CANNOT_LOAD

log = logging.getLogger("wisp.local_model")
server_log = logging.getLogger("wisp.llama")

MODEL_ALIAS = "SmolLM2-135M-Instruct"
# Per thread, like Apple's on-device model, so a thread behaves alike on Linux and on a Mac
# (and what the core's condensing assumes when it cannot ask).
DEFAULT_CONTEXT = 4096
# The most one answer may run to, as a share of a thread's context: a 135M model asked without
# max_output_tokens can write until its window is full (4,060 tokens to a short prompt). The
# server's -n, so it holds every request: max_output_tokens below it is kept, above it held to
# it; an answer it stopped ends with finish_reason "length".
OUTPUT_SHARE = 4
READY_TIMEOUT_S = 120.0
TERM_GRACE_S = 2.0
# WISP_LOCAL_CPU_THREADS past this is no machine's core count: the default is used instead.
MAX_CPU_THREADS = 1024

# What a signal death of the server most likely means, and what to do about it, per kind.
_SIGNAL_ADVICE = {
    NATIVE: {
        signal.SIGILL: "it uses a CPU instruction this machine does not allow (a VM can advertise AVX-512 or AMX "
                       "and trap it); rebuild it portable: `WISP_LLAMA_NATIVE=0 make local-model-native` in a wisp checkout, "
                       "or, for a llama-server of your own, llama.cpp's build with `-DGGML_NATIVE=OFF`",
        signal.SIGBUS: "its binary or the model file changed under it; run `make local-model-native` again",
        signal.SIGSEGV: "it crashed; run `make local-model-native` again, and if it persists rebuild it portable "
                        "with `WISP_LLAMA_NATIVE=0 make local-model-native`",
    },
    XLLAMACPP: {
        signal.SIGILL: "the xllamacpp wheel needs AVX2, which this CPU lacks or does not allow; build llama-server "
                       "for this CPU instead (`make local-model-native` in a wisp checkout, or llama.cpp's own "
                       "build) and give it with `--llama-server PATH`",
        signal.SIGBUS: "the model file changed under it; restart wisp",
    },
}
# Lines of the server's own log kept for an error about its exit (its log may have been dropped).
TAIL_LINES = 6


def describe_exit(server: Path | ServerProgram, returncode: int, when: str = "", tail: list[str] | None = None) -> str:
    """How a server exit reads in an error: a signal by its name, with the fix, and the last
    lines of its log. `when` ("while starting", "during its first decode") goes before the advice."""
    kind = server.kind if isinstance(server, ServerProgram) else NATIVE
    at = f" {when}" if when else ""
    last = ("; its last lines: " + " | ".join(tail)) if tail else ""
    if returncode == CANNOT_LOAD and kind == XLLAMACPP:
        return f"the local model server ({server}) could not load the xllamacpp wheel{at}{last}"
    if returncode >= 0:
        return f"the local model server ({server}) exited with status {returncode}{at}{last}"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"the local model server ({server}) was killed by signal {-returncode}{at}{last}"
    advice = _SIGNAL_ADVICE[kind].get(sig)
    return f"the local model server ({server}) was killed by {sig.name}{at}" + (f": {advice}" if advice else "") + last


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one: a container or
    `taskset` gives fewer than the machine has)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def default_cpu_threads(cpus: int | None = None) -> int:
    """The server's CPU threads, for generation and for prompts (-t, -tb): half the available
    CPUs (1 on a 2-core machine, at most 4), or WISP_LOCAL_CPU_THREADS (WISP_LOCAL_THREADS, its
    old name, still works). ggml's worker threads spin-wait for each other at every step, so
    with as many threads as cores any other busy process (the MCP client, a build, wisp itself)
    stalls every token (bench/README.md has the figures)."""
    env = config.env("WISP_LOCAL_CPU_THREADS") or ""
    if env.isdecimal() and 0 < int(env) <= MAX_CPU_THREADS:
        return int(env)
    return max(1, min(4, (cpus or available_cpus()) // 2))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent(parent: int, libc: object) -> None:
    """preexec_fn: SIGKILL this child when the shim dies, however it dies (Linux only).
    PDEATHSIG fires when the *thread* that forked exits, so spawn from a long-lived thread.
    `libc` is loaded before the fork: a child must not import."""
    with contextlib.suppress(Exception):
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # type: ignore[attr-defined]
    if os.getppid() != parent:  # the shim died before prctl took effect
        os._exit(1)


def _libc() -> object:
    # ctypes, like urllib below, is imported by the first use: a shim that never starts the
    # local model does not carry it.
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


@dataclass
class LocalModel:
    binary: Path  # the compiled llama-server, or (kind XLLAMACPP) the xllamacpp package
    model: Path
    context_size: int = DEFAULT_CONTEXT  # per slot, i.e. per thread
    cpu_threads: int = 0  # the server's -t and -tb
    port: int = 0
    slots: int = 1
    alias: str = MODEL_ALIAS
    kind: str = NATIVE
    # None: a new random one, which only the core (told through its environment) and this shim
    # know. "" starts it without a key: for benchmarks that talk to it directly, never for wisp.
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.cpu_threads:
            self.cpu_threads = default_cpu_threads()
        if not self.port:
            self.port = free_port()  # chosen now: the core's --endpoint names it before the server starts
        self.program = ServerProgram(self.kind, self.binary)
        if self.api_key is None:
            self.api_key = secrets.token_urlsafe(32)
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self._monitor: asyncio.Task[None] | None = None
        self.started_at = 0.0
        self.ready_after_s: float | None = None
        # The last exit seen (monotonic time it was seen, return code): the watcher restarts a
        # dead server at once, so a call that failed against it asks here how it died.
        self.last_exit: tuple[float, int] | None = None
        self._noted: subprocess.Popen[bytes] | None = None
        self._drainer: threading.Thread | None = None
        self._up = False  # the current process has answered /health

    @classmethod
    def of(cls, server: ServerProgram, model: Path, **settings: object) -> "LocalModel":
        return cls(binary=server.path, kind=server.kind, model=model, **settings)  # type: ignore[arg-type]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def core_args(self) -> list[str]:
        # --slots: the core pins each live thread to one of them (id_slot).
        return ["--backend", "openai", "--endpoint", self.endpoint, "--model", self.alias, "--slots", str(self.slots)]

    def core_env(self) -> dict[str, str]:
        return {"WISP_API_KEY": self.api_key} if self.api_key else {}

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def argv(self) -> list[str]:
        return [
            *self.program.command(), "-m", str(self.model), "--alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port),
            # Each slot its own context (no unified pool one thread could fill for the others),
            # and continuous batching so that slots decode together: both defaults with an
            # explicit -np, said here so a newer llama-server cannot change them.
            "-c", str(self.context_size * self.slots), "-np", str(self.slots),
            "--no-kv-unified", "--cont-batching",
            "-n", str(self.max_output_tokens),
            "-t", str(self.cpu_threads), "-tb", str(self.cpu_threads), "--no-ui",
        ]

    @property
    def max_output_tokens(self) -> int:
        return max(1, self.context_size // OUTPUT_SHARE)

    # --- lifecycle -----------------------------------------------------------

    def spawn(self) -> None:
        """Start the server process (does not wait for it to load the model)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self._stopping = False
        parent = os.getpid()
        libc = _libc() if sys.platform.startswith("linux") else None
        log.info("starting the local model: %s", " ".join(self.argv()))
        self.started_at = time.monotonic()
        self.tail.clear()
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,  # never the shim's stdout (MCP) nor its stderr (see the module's docstring)
            stderr=subprocess.STDOUT,
            env=self._env(),
            start_new_session=True,  # its own process group, out of reach of the terminal's ^C
            preexec_fn=(lambda: _die_with_parent(parent, libc)) if libc is not None else None,
            close_fds=True,
        )
        self._drainer = threading.Thread(target=self._drain, args=(self.proc,), name="local model log", daemon=True)
        self._drainer.start()

    def _env(self) -> dict[str, str]:
        # Never an empty key: llama-server would take "" as the one key to require.
        env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
        if self.api_key:
            env[API_KEY_ENV] = self.api_key
        return env

    def _drain(self, proc: subprocess.Popen[bytes]) -> None:
        """Reads the server's output until it exits: each line to the shim's log sink, which drops
        what a stderr nobody reads cannot take; the last few kept for an error about its exit."""
        assert proc.stdout is not None
        with proc.stdout:
            for raw in proc.stdout:
                line = raw.rstrip(b"\n").decode("utf-8", "replace")
                if proc is self.proc:
                    self.tail.append(line[:300])
                server_log.info("%s", line)

    def _note_exit(self) -> bool:
        """True when the server process has exited; records how, once per process."""
        proc = self.proc
        if proc is None or proc.poll() is None:
            return False
        if self._noted is not proc:
            self._noted = proc
            if self._drainer is not None:
                self._drainer.join(0.2)  # its last lines, for the error that names the exit
            self.last_exit = (time.monotonic(), proc.returncode)
            self._up = False
        return True

    async def died_since(self, since: float, wait: float = 0.5, when: str = "during this call") -> str | None:
        """How the server died, if it exited at or after `since` (time.monotonic()) or is still
        down (dead, or restarted and not yet healthy) after an exit; else None. Waits up to `wait`
        s for a process whose connection just broke to be reaped: its socket closes a moment
        before the kernel reports the exit."""
        deadline = time.monotonic() + wait
        while True:
            self._note_exit()
            if self.last_exit is not None:
                at, returncode = self.last_exit
                if at >= since:
                    return describe_exit(self.program, returncode, when, list(self.tail))
                if not self._up:
                    return describe_exit(self.program, returncode, "shortly before this call (wisp is restarting it)",
                                         list(self.tail))
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.05)

    def healthy(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1.0) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    async def ensure_running(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Start (or restart) the server and wait until it answers /health; then watch it.
        Raises LocalModelError."""
        await self._start_and_wait(timeout)
        if self._monitor is None or self._monitor.done():
            self._monitor = asyncio.get_running_loop().create_task(self._watch(), name="local model monitor")

    async def _start_and_wait(self, timeout: float) -> None:
        if self.proc is None or self._note_exit():
            if self.proc is not None:
                log.warning("%s; restarting it",
                            describe_exit(self.program, self.proc.returncode, tail=list(self.tail)))
            self.spawn()
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self._note_exit():
                raise LocalModelError(describe_exit(self.program, self.proc.returncode, "while starting",
                                                    list(self.tail)))
            if await asyncio.to_thread(self.healthy):
                self._up = True
                if self.ready_after_s is None:
                    self.ready_after_s = time.monotonic() - self.started_at
                    log.info("local model ready in %.2f s at %s", self.ready_after_s, self.endpoint)
                return
            if time.monotonic() > deadline:
                raise LocalModelError(f"the local model server did not become healthy within {timeout:.0f} s at "
                                      f"{self.endpoint}")
            await asyncio.sleep(0.05)

    async def _watch(self) -> None:
        """Restart the server on the same port if it dies while wisp runs."""
        backoff = 1.0
        while not self._stopping:
            await asyncio.sleep(1.0)
            if self._stopping or not self._note_exit():
                continue
            try:
                await self._start_and_wait(READY_TIMEOUT_S)
                backoff = 1.0
            except LocalModelError as exc:
                log.error("%s; retrying in %.0f s", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL after 2 s. Safe to call twice."""
        self._stopping = True
        if self._monitor is not None and not self._monitor.done():
            with contextlib.suppress(RuntimeError):
                self._monitor.cancel()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.info("local model server stopped")


VERIFY_PROMPT = "The capital of France is"
VERIFY_TOKENS = 4


async def decode(lm: LocalModel, timeout: float = READY_TIMEOUT_S) -> str | None:
    """One short decode on the running server: None when it computed, else why not. The decode
    is the point: matrix kernels (where an instruction the CPU does not allow would trap) run
    only once a prompt is evaluated, never for --version or /health."""
    import http.client
    import json
    import urllib.error
    import urllib.request

    body = json.dumps({"prompt": VERIFY_PROMPT, "n_predict": VERIFY_TOKENS, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{lm.port}/completion", data=body,
                                 headers={"Content-Type": "application/json", **lm.auth()})

    def post() -> object:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    since = time.monotonic()
    try:
        answer = await asyncio.to_thread(post)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        died = await lm.died_since(since, wait=2.0, when="during a decode")
        if died:
            return died
        return f"the local model server ({lm.program}) gave no answer to a {VERIFY_TOKENS}-token decode: {exc}"
    predicted = answer.get("tokens_predicted") if isinstance(answer, dict) else None
    if not isinstance(predicted, int) or predicted < 1:
        return f"the local model server ({lm.program}) decoded no tokens (answer: {str(answer)[:200]})"
    return None


def refuses_unkeyed(lm: LocalModel, timeout: float = 10.0) -> str | None:
    """None when the running server refuses a request without its key (401), else what it did:
    the port is open to every local user, and the model wisp started must answer only wisp."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{lm.port}/v1/chat/completions", data=b"{}",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status: int | str = r.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        status = f"no answer ({exc})"
    if status == 401:
        return None
    return f"the local model server ({lm.program}) answered a request without its key: {status}, not 401"


def verify(binary: Path, model: Path, timeout: float = READY_TIMEOUT_S, kind: str = NATIVE) -> str | None:
    """Start the server on `model`, decode a few tokens, stop it. None when it computed, else why not."""
    lm = LocalModel(binary=binary, model=model, context_size=512, cpu_threads=1, kind=kind)

    async def run() -> str | None:
        try:
            await lm._start_and_wait(timeout)
        except LocalModelError as exc:
            return str(exc)
        return await decode(lm, timeout)

    try:
        return asyncio.run(run())
    finally:
        lm.stop()
