"""Fixtures shared by the test modules (their helpers are in harness/)."""

from __future__ import annotations

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
