"""Content-hash cache of judge replies: an identical prompt (same prompt version, model, rubrics,
task, context and step content) is not paid for twice. A bounded LRU in the worker's memory;
streams/judge/ledger.py `SharedReplyCache` backs it with a Kafka topic, so a restarted judge, a
replica or a replay of the log finds the replies paid for before.

Only replies that parsed are stored, each with what its call cost, when its events were made and
their ids (`CallRecord`, a string in the cache). A hit for the same targets (a replay of the log, a
restarted judge reading its input again) gives the call's own events again, byte for byte, so a
replay reproduces every judge row, cost included; a hit for other targets with the same content is
turned into events with `cached=True`, zero tokens and zero cost. Entries stored as plain text (before
records) count as the latter.

>>> import asyncio
>>> c = ReplyCache(2)
>>> k = content_key("judge-v1", "m", "system", "user")
>>> asyncio.run(c.store(k, "{}"))
>>> c.get(k)
'{}'
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import orjson

RECORD_PREFIX = "agentstream-judge-call/1\n"  # never the start of a model's reply


@dataclass(frozen=True)
class CallRecord:
    """A cached reply and its call: the text, the call's facts (`CallMeta` fields), the time its
    events carry and their ids (None for a plain-text entry).

    >>> r = CallRecord("{}", {"judge_model": "m", "cost_usd": 0.5}, "2026-01-01T00:00:00+00:00", ["e1"])
    >>> CallRecord.decode(r.encode()) == r, CallRecord.decode('{"score": 1}').meta
    (True, None)
    """

    text: str
    meta: dict | None = None
    at: str | None = None
    ids: list[str] | None = None

    def encode(self) -> str:
        if self.meta is None:
            return self.text
        body = {"text": self.text, "meta": self.meta, "at": self.at, "ids": self.ids}
        return RECORD_PREFIX + orjson.dumps(body).decode()

    @classmethod
    def decode(cls, value: str) -> CallRecord:
        if not value.startswith(RECORD_PREFIX):
            return cls(value)
        body = orjson.loads(value[len(RECORD_PREFIX) :])
        return cls(body["text"], body["meta"], body["at"], body["ids"])


def content_key(prompt_version: str, model: str, system: str, user: str) -> str:
    digest = hashlib.sha256()
    for part in (prompt_version, model, system, user):
        digest.update(part.encode())
        digest.update(b"\x1f")
    return digest.hexdigest()


class ReplyCache:
    """The in-memory cache; `open` and `store` are the points a durable cache extends."""

    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._data: OrderedDict[str, str] = OrderedDict()
        self.hits = 0
        self.misses = 0

    async def open(self) -> None:
        """Nothing to load (the shared cache reads its topic here, before the first lookup)."""

    def get(self, key: str) -> str | None:
        value = self._data.get(key)
        if value is None:
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: str, text: str) -> None:
        """Into memory only (also how a durable cache loads what it reads)."""
        if self.max_entries <= 0:
            return
        self._data[key] = text
        self._data.move_to_end(key)
        while len(self._data) > self.max_entries:
            self._data.popitem(last=False)

    async def store(self, key: str, text: str) -> None:
        """Keep a reply that was paid for (durably, in a durable cache, before this returns)."""
        self.put(key, text)

    def __len__(self) -> int:
        return len(self._data)
