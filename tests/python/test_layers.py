"""The shim's layering (wisp_shim.LAYERS): no module imports a layer above its own, and parsing
flags (config) loads none of the layers, nor anyio, msgspec or the SDK. Read from the source, so
a lazy import inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import wisp_shim

PACKAGE = Path(wisp_shim.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    """The layer of a module of the package: its subpackage, or "" for a leaf at the top."""
    parts = module.split(".")[1:]
    if not parts:
        return ""
    return parts[0] if parts[0] in wisp_shim.LAYERS else ""


def _imported(source: str, module: str, is_package: bool) -> set[str]:
    """The package's modules that `source` (the text of `module`) imports, anywhere in it."""
    found = set()
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "wisp_shim"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "wisp_shim":
                continue
            # `from x import y`: y may be a module (a layer, `from wisp_shim import __main__`) or a
            # name in x; a layer is named by the part after wisp_shim, so either reads right.
            found |= {f"{target}.{a.name}" for a in node.names}
    return found


def upward_imports(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """Each import of a layer above the importer's, as `importer -> imported`."""
    rank = {layer: i for i, layer in enumerate(wisp_shim.LAYERS)}
    bad = []
    for module, (source, is_package) in sorted(sources.items()):
        own = rank[_layer(module)]
        for target in sorted(_imported(source, module, is_package)):
            if rank[_layer(target)] > own:
                bad.append(f"{module} ({_layer(module) or 'leaf'}) -> {target} ({_layer(target)})")
    return bad


def _package_sources() -> dict[str, tuple[str, bool]]:
    return {_module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
            for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_imports_a_layer_above_its_own():
    sources = _package_sources()
    assert len(sources) > 30, sorted(sources)
    assert upward_imports(sources) == []


def test_every_subpackage_is_a_declared_layer_and_every_layer_exists():
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(wisp_shim.LAYERS) - {"", "__main__"}
    assert (PACKAGE / "__main__.py").is_file()


def test_the_check_sees_an_upward_import_in_any_form():
    # The same check on made-up modules: each of these reaches a layer above its own.
    sources = {
        "wisp_shim.config": ("from .http import server\n", False),
        "wisp_shim.core.client": ("def f():\n    from ..mcp.tools import respond\n", False),
        "wisp_shim.transport": ("from . import guard\nfrom ..http.server import options\n", True),
        "wisp_shim.errors": ("import wisp_shim.core.protocol\n", False),
        "wisp_shim.mcp.server": ("from wisp_shim import __main__\n", False),
        # Allowed: its own layer and those below.
        "wisp_shim.http.guards": ("from ..transport.request_ids import judge\nfrom . import token\n"
                                  "from .. import config\n", False),
    }
    assert [line.split(" ")[0] for line in upward_imports(sources)] == [
        "wisp_shim.config", "wisp_shim.core.client", "wisp_shim.errors", "wisp_shim.mcp.server", "wisp_shim.transport"]


def test_parsing_flags_loads_no_layer_nor_anything_heavy():
    probe = (
        "import sys\n"
        "from wisp_shim import config\n"
        "ns = config.parse_args(['--backend', 'echo', '--timeout', '9', '--max-threads', '3'])\n"
        "config.core_args(ns), config.timeout_s(ns), config.http_address(ns)\n"
        "heavy = ('anyio', 'msgspec', 'mcp', 'mcp_types', 'pydantic', 'starlette', 'uvicorn', 'httpx', 'jsonschema')\n"
        "layers = [n for n in sys.modules if n.startswith('wisp_shim.') and n.split('.')[1] in "
        "('core', 'localmodel', 'transport', 'mcp', 'http', '__main__')]\n"
        "print(' '.join(layers + [n for n in sys.modules if n.split('.')[0] in heavy]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"parsing flags imported {done.stdout}"
