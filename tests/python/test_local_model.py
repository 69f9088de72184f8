"""wisp's own local model, planned and started without building it (a fake `llama-server`,
fake_llama_server.py): which backend a configuration gets, how many slots and what argv, the
server answering only wisp and never stalling it, and what a GGUF says of itself. A server
that cannot compute here is test_local_sigill.py; each thread's slot, test_local_slots.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO, install_fake, ok, shim_command, wisp
from harness.fake_llama import SIGILL_FIX, flag_value, shim_env_with
from wisp_shim.localmodel import llama_install, llama_server
from wisp_shim.localmodel import local_model as lm
from wisp_shim.localmodel.local_model import APPLE_ONLY, LEAVE_TO_CORE, LOCAL, NOT_INSTALLED, PROBE_APPLE, decide



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


def test_argv_gives_every_slot_the_whole_per_thread_context(model_file):
    argv = lm.LocalModel(binary=Path("/x/llama-server"), model=model_file, context_size=4096, slots=11, port=1).argv()
    assert (flag_value(argv, "-np"), flag_value(argv, "-c")) == ("11", str(11 * 4096))
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
