"""Fixtures shared by the test modules (their helpers are in harness/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.tasks import Raw


@pytest.fixture
def raw_clients():
    made: list[Raw] = []

    def make(*args: Any, **kw: Any) -> Raw:
        made.append(Raw(*args, **kw))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def model_file(tmp_path) -> Path:
    """A file under the bundled model's name (so the fake llama-server serves it under that name);
    the fake never reads it."""
    from wisp_shim.localmodel import llama_install

    path = tmp_path / llama_install.MODEL_FILE
    path.write_bytes(b"GGUF")
    return path
