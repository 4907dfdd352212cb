"""StateCache (streams/batch.py): a role decodes a trajectory's state once while the table holds the
bytes it came from, and again whenever the table's value was replaced behind its back (a partition
recovered from the changelog after another worker had it)."""

from __future__ import annotations

import orjson

from streams.batch import StateCache


def test_a_state_is_decoded_once_while_the_table_holds_its_bytes():
    decoded = []

    def decode(raw):
        decoded.append(raw)
        return orjson.loads(raw) if raw else {}

    cache, table = StateCache(decode), {}
    state = cache.get(b"t", table.get)  # nothing stored yet
    state["n"] = 1
    table[b"t"] = raw = orjson.dumps(state)
    cache.stored(b"t", raw, state)
    assert cache.get(b"t", table.get) is state and cache.get(b"t", table.get) is state
    assert decoded == [None]


def test_a_value_replaced_behind_its_back_is_decoded_again():
    cache, table = StateCache(lambda raw: orjson.loads(raw) if raw else {}), {}
    mine = {"n": 1}
    table[b"t"] = raw = orjson.dumps(mine)
    cache.stored(b"t", raw, mine)
    table[b"t"] = orjson.dumps({"n": 7})  # equal or not, another object: recovered from the changelog
    assert cache.get(b"t", table.get) == {"n": 7}
    del table[b"t"]  # deleted: a fresh state, not the cached one
    assert cache.get(b"t", table.get) == {}


def test_the_least_recently_used_go_first():
    cache, table = StateCache(lambda raw: {"raw": raw}, size=2), {}
    for key in (b"a", b"b", b"c"):
        table[key] = key
        cache.get(key, table.get)
    assert len(cache) == 2
    cache.clear()
    assert len(cache) == 0
