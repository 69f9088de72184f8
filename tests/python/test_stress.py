"""The short stress run inside `make test`: 1,000 respond calls over 64 thread ids,
capacity 32, 50 in flight, !sleep 0-20 ms each. `make stress` runs 10,000 (stress.py)."""

from __future__ import annotations

import stress


async def test_short_stress_every_call_answered_once_threads_consistent_capacity_held():
    fig = await stress.run(calls=1000, thread_ids=64, capacity=32, in_flight=50, max_sleep_ms=20, timeout_s=60)
    print(fig.summary())
    assert not fig.errors, fig.errors[:5]
    assert not fig.problems, fig.problems[:5]
    assert fig.max_live <= 32 and fig.polls >= 1
    # The run must have exercised eviction, or it proved nothing about it.
    assert fig.evictions > 0


def test_the_sequence_check_can_fail():
    good = {"a": [(True, 1, 0), (False, 2, 1), (True, 1, 2), (False, 3, 3), (False, 2, 4)]}
    assert stress.check_sequences(good) == []
    assert stress.check_sequences({"a": [(True, 1, 0), (False, 3, 1)]})  # N skipped 2
    assert stress.check_sequences({"a": [(True, 1, 0), (False, 2, 1), (False, 2, 2)]})  # 2 twice in one incarnation
    assert stress.check_sequences({"a": [(False, 1, 0)]})  # N = 1 without created
    assert stress.check_sequences({"a": [(True, 1, 0), (True, 2, 1)]})  # created with N = 2
