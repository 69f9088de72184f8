"""The shim's configuration: every flag and environment variable declared once, in SETTINGS, from
which `--help`, the parsing and checking of both, and the core's command line come.

A flag wins over its variable. The core's own settings reach it as its flags when given as
flags, and through the inherited environment when set as variables (so those are checked here:
a core refusing its configuration would only be restarted in vain).

It imports no layer of the shim (wisp_shim.LAYERS): the layers that take a setting's value
(core.process's CoreLaunch.from_flags, http.options's options) read it from here, so that parsing
flags (`--help`, `--version`) loads none of them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .facts import BACKENDS, DEFAULT_MAX_THREADS, FLAG_DEFAULTS, FLAG_MAXIMUMS, FLAG_MINIMUMS

LOG_LEVELS = ("debug", "info", "warning", "error")
# Above any count anyone means (--max-sessions): the core's flags have their own (FLAG_MAXIMUMS).
MAX_FLAG_VALUE = 2**31 - 1
# The longest time a setting takes, in seconds (11.5 days): far above any use, far below what a
# monotonic deadline can hold.
MAX_SECONDS = 1_000_000.0

# How a setting's value is written: text, a count within the core's range for that flag, a
# count of at least 1, seconds, a switch, a list (the flag repeated), or one of `choices`.
TEXT, CORE_COUNT, COUNT, SECONDS = "text", "core_count", "count", "seconds"
SWITCH, LIST, CHOICE = "switch", "list", "choice"

# Defaults of settings the layers above take as values (core.process, http.options): declared
# here, beside their --help lines, so that parsing flags imports none of those layers.
# A respond call's time limit when none is configured (--timeout / WISP_TIMEOUT).
DEFAULT_TIMEOUT_S = 300.0
# Progress at least this often, from a call's start to its end, whatever it waits for: clients
# that reset their time limit on progress (Claude Code) keep a slow call alive; half the 10 s
# that wisp promises, so a slow client or loop still keeps it (WISP_PROGRESS_EVERY_S).
PROGRESS_EVERY_S = 5.0
DEFAULT_HTTP = "127.0.0.1:8765"
DEFAULT_MAX_SESSIONS = 64
DEFAULT_SESSION_IDLE_S = 30 * 60.0
# Where --install-local-model asks for the pinned wheels (WISP_PYPI_URL): PyPI's JSON API.
DEFAULT_PYPI_URL = "https://pypi.org"


@dataclass(frozen=True)
class Setting:
    """One setting: its flag (and other spellings), its variable, what it does (`text`) and the
    rest of --help's note after the variable (`note`). `core`: the core takes it as the same
    flag. `group`: the --help section it is listed in. A setting with no flag is read from its
    variable only (and listed in --help's epilog). `secret`: a core setting that may carry a
    password, handed to the core in its variable (`core_env`), never on its command line, which
    the shim logs and any process listing shows."""

    flags: tuple[str, ...]
    env: str | None
    text: str
    note: str = ""
    kind: str = TEXT
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    core: bool = False
    group: str | None = None
    secret: bool = False

    @property
    def dest(self) -> str:
        return self.flags[0][2:].replace("-", "_")

    def help(self) -> str:
        default = FLAG_DEFAULTS.get(self.flags[0]) if self.kind == CORE_COUNT else None
        note = self.note or (f"default {default}" if default is not None else "")
        env = f"{self.env}=1" if self.env and self.kind == SWITCH else self.env
        said = "; ".join(x for x in (env, note) if x)
        return f"{self.text} ({said})" if said else self.text


HTTP = "shared server (MCP over streamable HTTP instead of stdio, for every client on the machine)"

SETTINGS: tuple[Setting, ...] = (
    Setting(("--backend",), "WISP_BACKEND", "model backend", "default auto: apple where available, else openai",
            kind=CHOICE, choices=BACKENDS, core=True),
    Setting(("--model",), "WISP_MODEL", "model name for the backend", metavar="NAME", core=True),
    Setting(("--endpoint",), "WISP_ENDPOINT",
            "OpenAI-compatible base URL for --backend openai; repeat for several servers (each thread kept on one)",
            "','-separated", kind=LIST, metavar="URL", core=True),
    Setting(("--session-header",), "WISP_SESSION_HEADER",
            "header naming the thread on each request to the model server, for a router to pin by; '' for none",
            "default X-Session-ID", metavar="NAME", core=True),
    Setting(("--max-threads",), "WISP_MAX_THREADS",
            "live threads kept before the least recently used is evicted; also the local model's parallel slots "
            "unless WISP_SLOTS says, as memory allows", kind=CORE_COUNT, metavar="N", core=True),
    Setting(("--max-queue",), "WISP_MAX_QUEUE", "calls waiting on one thread before new ones get `busy`",
            kind=CORE_COUNT, metavar="N", core=True),
    Setting(("--context-size",), "WISP_CONTEXT_SIZE",
            "context window in tokens, when the backend cannot tell; the local model's per thread",
            kind=CORE_COUNT, metavar="N", core=True),
    Setting(("--llama-server",), "WISP_LLAMA_SERVER", "local model: a compiled llama-server binary",
            "default: the one `make local-model-native` built, else llama-server on PATH, else the xllamacpp wheel",
            metavar="PATH"),
    Setting(("--model-path", "--local-model"), "WISP_MODEL_PATH",
            "local model: serve this GGUF instead of SmolLM2-135M-Instruct, with its own chat template and its "
            "trained context as the bound", metavar="GGUF"),
    Setting(("--root",), "WISP_ROOTS", "directory the model's file tools may use; repeat for more", "':'-separated",
            kind=LIST, metavar="DIR", core=True),
    Setting(("--allow-hardlinks",), "WISP_ALLOW_HARDLINKS",
            "let the model's file tools read files with more than one hard link",
            "default: refused, as such a file may be one from outside the roots", kind=SWITCH, core=True),
    Setting(("--state-dir",), "WISP_STATE_DIR",
            "durable threads: store every thread in DIR (created, mode 0700) so a crash or restart loses none",
            "default: memory only", metavar="DIR", core=True),
    Setting(("--store",), "WISP_STORE",
            "durable threads in PostgreSQL, shared by every wisp on the database: a postgresql:// URL (libpq's "
            "URI; give the password by PGPASSWORD or ~/.pgpass); not with --state-dir", metavar="URL", core=True,
            secret=True),
    Setting(("--max-stored-threads",), "WISP_MAX_STORED_THREADS",
            "stored threads kept before the least recently used is deleted", kind=CORE_COUNT, metavar="N", core=True),
    Setting(("--echo-delay-ms",), "WISP_ECHO_DELAY_MS", "echo backend: extra delay per reply",
            kind=CORE_COUNT, metavar="N", core=True),
    Setting(("--timeout",), "WISP_TIMEOUT", "time limit for one respond call", f"default {DEFAULT_TIMEOUT_S:g}",
            kind=SECONDS, metavar="SECONDS"),
    Setting(("--core",), "WISP_CORE", "the wisp-core binary", "default: bundled copy, then .build/release/wisp-core",
            metavar="PATH"),
    Setting(("--log-level",), "WISP_LOG_LEVEL", "stderr log level for wisp and wisp-core", "default info",
            kind=CHOICE, choices=LOG_LEVELS, core=True),
    Setting(("--check",), None,
            "start the core, print backend, model and availability, and exit (0 if a model is available)",
            kind=SWITCH),
    Setting(("--install-local-model",), None,
            "download the local model (llama.cpp's server and SmolLM2, about 130 MB, from PyPI) into "
            "$XDG_DATA_HOME/wisp/local-model, check that it computes here, and exit (0 once installed)",
            kind=SWITCH),
    Setting(("--http",), "WISP_HTTP", "serve MCP at http://HOST:PORT/mcp; every request needs the bearer token",
            f"e.g. {DEFAULT_HTTP}", metavar="HOST:PORT", group=HTTP),
    Setting(("--token-file",), None,
            "--http: read the token from PATH (mode 0600) when WISP_HTTP_TOKEN is not set (default: a generated one "
            "in $XDG_CONFIG_HOME/wisp/http-token)", metavar="PATH", group=HTTP),
    Setting(("--allow-remote",), None, "--http: allow an address that is not loopback (put a TLS proxy in front)",
            kind=SWITCH, group=HTTP),
    Setting(("--eager",), None, "--http: start the core and the local model at once, not with the first request",
            kind=SWITCH, group=HTTP),
    Setting(("--max-sessions",), None,
            "--http: 2025-11-25 MCP sessions open at once; 2026-07-28 clients open none "
            f"(default {DEFAULT_MAX_SESSIONS})", kind=COUNT, metavar="N", group=HTTP),
    Setting(("--session-idle-timeout",), None,
            f"--http: a session without a request this long is closed (default {DEFAULT_SESSION_IDLE_S:g})",
            kind=SECONDS, metavar="SECONDS", group=HTTP),
    # Read from the environment only.
    Setting((), "WISP_API_KEY", "API key for --endpoint (environment only: it stays out of process listings)"),
    Setting((), "WISP_LOCAL_MODEL", "0: never start the local model; 1: start it even on macOS"),
    Setting((), "WISP_LOCAL_CPU_THREADS",
            "local model: the server's CPU threads (default half the available CPUs, at most 4; "
            "WISP_LOCAL_THREADS, its old name, still works)"),
    Setting((), "WISP_CACHE_DIR", "where `make local-model-native` caches llama-server (default ~/.cache/wisp)"),
    Setting((), "WISP_PYPI_URL",
            f"--install-local-model: the package index to download from, serving PyPI's JSON API "
            f"(default {DEFAULT_PYPI_URL})"),
    Setting((), "WISP_HTTP_TOKEN", "--http: the bearer token (environment only: it stays out of process listings)"),
    Setting((), "WISP_TASK_TTL", "MCP tasks: the longest a task's result is kept, in seconds (default 3600)"),
    Setting((), "WISP_MAX_TASKS", "MCP tasks: tasks one client may hold, running or kept (default 32, at most 256)"),
    Setting((), "WISP_SLOTS",
            "llama-server's parallel slots, each live thread kept on one (default: what its /props says; the local "
            "model's: one per live thread, as memory allows; 0: name no slot)"),
    Setting((), "WISP_KEEP_ALIVE", "Ollama: keep the model loaded this long between turns (default 30m)"),
    Setting((), "WISP_CONDENSE_TO",
            "share of the context a thread is condensed down to on servers that cannot shift their cache "
            "(default 0.5)"),
    Setting((), "WISP_PROGRESS_EVERY_S",
            f"progress notifications at least this often during a call (default {PROGRESS_EVERY_S:g})"),
)

# Old names still read, each for the setting that replaced it.
OLD_NAMES = {"WISP_LOCAL_CPU_THREADS": ("WISP_LOCAL_THREADS",)}
DECLARED = frozenset(s.env for s in SETTINGS if s.env)


def env(name: str) -> str | None:
    """Setting `name`'s variable (or an old name of it), None when unset or empty: the shim's one
    read of a WISP_* variable, so that each is declared here (its --help line) and nowhere else.
    A name not in SETTINGS is a bug in wisp, refused at once rather than read silently."""
    if name not in DECLARED:
        raise KeyError(f"{name} is not a setting declared in config.SETTINGS")
    for spelling in (name, *OLD_NAMES.get(name, ())):
        if value := os.environ.get(spelling):
            return value
    return None


DESCRIPTION = """\
wisp: an MCP server (stdio) that hands work to a local language model and keeps
conversation threads with it. An MCP client starts it; you normally don't run it by hand.

It starts the wisp-core process (Swift) in the background. Every option below can also
be set with the environment variable shown; a flag wins over the environment.
"""

EXAMPLES = """\
examples:
  python -m wisp_shim --check                      is a model available? (prints status, exit 0 if so)
  python -m wisp_shim --backend echo               no model: replies "echo N: <prompt>" (for trying wisp)
  python -m wisp_shim --backend openai --endpoint http://127.0.0.1:8080/v1 --model qwen3
                                                   any OpenAI-compatible server (llama.cpp, Ollama, vLLM)
"""

CLOSING = """\
wisp-core not found? In a wisp checkout run `make build`; an installed wisp-mcp carries its own
(reinstall it); or give one with --core.
stdout carries only MCP messages; logs go to stderr. SIGTERM, SIGINT, SIGHUP and SIGQUIT
stop running calls and the core, and wisp exits.

shared server: python -m wisp_shim --http 127.0.0.1:8765 serves every MCP client on the
machine from one core and one model; clients send `Authorization: Bearer <token>` (docs/http.md).
"""


def _epilog() -> str:
    with_flags = [s.env for s in SETTINGS if s.flags and s.env]
    lines = ["environment (a flag wins over its variable):"]
    lines += textwrap.wrap(", ".join(with_flags) + ": the flags above", 96, initial_indent="  ",
                           subsequent_indent="  ")
    for s in SETTINGS:
        if not s.flags and s.env:
            said = textwrap.wrap(s.text, 68)
            lines.append(f"  {s.env:<28} {said[0]}")
            lines += [" " * 31 + more for more in said[1:]]
    return "\n".join([EXAMPLES, *lines, "", CLOSING])


def _in_range(minimum: int, maximum: int = MAX_FLAG_VALUE) -> Callable[[str], int]:
    """An argparse type: an integer from minimum to maximum, so a bad value is refused here with
    a clear message instead of by a core that would then fail to start again and again."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value

    return parse


def _argument(s: Setting) -> dict[str, Any]:
    """How argparse takes `s`."""
    if s.kind == SWITCH:
        return {"action": "store_true"}
    taken: dict[str, Any] = {"metavar": s.metavar}
    if s.kind == CORE_COUNT:
        taken["type"] = _in_range(FLAG_MINIMUMS[s.flags[0]], FLAG_MAXIMUMS[s.flags[0]])
    elif s.kind == COUNT:
        taken["type"] = _in_range(1)
    elif s.kind == SECONDS:
        taken["type"] = float
    elif s.kind == LIST:
        taken["action"] = "append"
    elif s.kind == CHOICE:
        taken = {"choices": s.choices}
    return taken


class _VersionAction(argparse.Action):
    """`--version`: wisp's version, looked up only when asked for (version.py)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from .version import DISTRIBUTION, version

        sys.stdout.write(f"{DISTRIBUTION} {version()}\n")  # run by a person, as argparse's own --version
        parser.exit()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # The same flags under each name it runs by: a console script (pyproject.toml's) by its name,
    # `python -m wisp_shim` (argv[0] is then __main__.py) by that.
    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    ap = argparse.ArgumentParser(
        prog=script if script and not script.endswith(".py") else "python -m wisp_shim",
        description=DESCRIPTION,
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    groups: dict[str | None, Any] = {None: ap}
    for s in SETTINGS:
        if s.flags:
            group = groups.get(s.group) or groups.setdefault(s.group, ap.add_argument_group(s.group))
            group.add_argument(*s.flags, dest=s.dest, help=s.help(), **_argument(s))
    ap.add_argument("--version", action=_VersionAction, help="print wisp's version and exit")
    return ap.parse_args(argv)


def _env_number(name: str, parse: Callable[[str], Any], what: str) -> Any:
    """Variable `name` read by `parse`; None when it is unset or empty."""
    raw = env(name)
    if raw is None:
        return None
    try:
        return parse(raw)
    except ValueError:
        raise SystemExit(f"wisp: {name}={raw!r} is not {what}") from None


def _env_float(name: str, default: float) -> float:
    value = _env_number(name, float, "a number")
    return default if value is None else value


def _seconds(said: str, value: float) -> float:
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise SystemExit(f"wisp: {said} must be a finite number of seconds above 0 and at most {MAX_SECONDS:g}, "
                         f"got {value}")
    return value


def core_args(ns: argparse.Namespace) -> list[str]:
    """The core's command line from the flags given; its settings given as variables are checked
    here, since they reach it through the inherited environment."""
    args: list[str] = []
    for s in SETTINGS:
        if not s.core or s.secret:
            continue
        if s.kind == CORE_COUNT and s.env and (raw := env(s.env)):
            try:
                _argument(s)["type"](raw)
            except argparse.ArgumentTypeError as exc:
                raise SystemExit(f"wisp: {s.env}: {exc}") from None
        value = getattr(ns, s.dest)
        if s.kind == SWITCH:
            args += [s.flags[0]] if value else []
        elif s.kind == LIST:
            for item in value or ():
                args += [s.flags[0], item]
        elif value is not None:
            args += [s.flags[0], str(value)]
    return args


def core_env(ns: argparse.Namespace) -> dict[str, str] | None:
    """The secret core settings given as flags, as the variables the core reads (a flag wins over
    the inherited variable, as on the command line)."""
    given = {s.env: getattr(ns, s.dest) for s in SETTINGS if s.secret and s.env and getattr(ns, s.dest) is not None}
    return given or None


def core_path(ns: argparse.Namespace) -> str | None:
    return ns.core or env("WISP_CORE")


def timeout_s(ns: argparse.Namespace) -> float:
    return _seconds("--timeout / WISP_TIMEOUT",
                    ns.timeout if ns.timeout is not None else _env_float("WISP_TIMEOUT", DEFAULT_TIMEOUT_S))


def progress_every_s() -> float:
    return _seconds("WISP_PROGRESS_EVERY_S", _env_float("WISP_PROGRESS_EVERY_S", PROGRESS_EVERY_S))


def state_dir(ns: argparse.Namespace) -> str | None:
    # As the core reads it: the flag wins over the variable, and an empty value means none.
    return (ns.state_dir if ns.state_dir is not None else env("WISP_STATE_DIR")) or None


def store_kind(ns: argparse.Namespace) -> str | None:
    """Which store threads are configured to live in, for what wisp tells callers about retention:
    "state_dir", "postgresql" or None (the core judges whether it can use it)."""
    if state_dir(ns):
        return "state_dir"
    return "postgresql" if (ns.store if ns.store is not None else env("WISP_STORE")) else None


def max_threads(ns: argparse.Namespace) -> int:
    return ns.max_threads or _env_number("WISP_MAX_THREADS", int, "an integer") or DEFAULT_MAX_THREADS


def log_level(ns: argparse.Namespace) -> str:
    level = ns.log_level or env("WISP_LOG_LEVEL") or "info"
    return level if level in LOG_LEVELS else "info"


def http_address(ns: argparse.Namespace) -> str | None:
    """--http's HOST:PORT as given (None: serve stdio); the shared server's other flags are
    refused without it."""
    where = ns.http or env("WISP_HTTP")
    if where is None:
        for s in SETTINGS:
            if s.group == HTTP and s.flags[0] != "--http" and getattr(ns, s.dest):
                raise SystemExit(f"wisp: {s.flags[0]} is for the shared server: add --http HOST:PORT "
                                 "(or set WISP_HTTP)")
    return where


def session_idle_s(ns: argparse.Namespace) -> float:
    idle = ns.session_idle_timeout if ns.session_idle_timeout is not None else DEFAULT_SESSION_IDLE_S
    if not (math.isfinite(idle) and idle > 0):
        raise SystemExit(f"wisp: --session-idle-timeout must be a finite number of seconds above 0, got {idle}")
    return idle
