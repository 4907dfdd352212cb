"""Content-hash cache of judge replies: an identical prompt (same prompt version, model, rubrics,
task, context and step content) is not paid for twice. A bounded LRU in the worker's memory;
streams/judge/ledger.py `SharedReplyCache` backs it with a Kafka topic, so a restarted judge, a
replica or a replay of the log finds the replies paid for before.

Only replies that parsed are stored. A hit is turned into events with `cached=True`, zero tokens
and zero cost.

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
