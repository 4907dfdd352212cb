"""A small faust app for the broker tests: counts words from a topic into a changelogged table.

Run as a real worker: `python -m tests.broker_fixtures.faust_app worker -l info` with
BROKER_TEST_BOOTSTRAP (host:port), BROKER_TEST_OUT (a file: one "word count" line per event) and
BROKER_TEST_DATADIR (faust's state directory) in the environment. The table lives in memory, so a
restarted worker can only know earlier counts by replaying the changelog from the broker.
"""

from __future__ import annotations

import os

import faust

APP_ID = "broker-test-counter"
WORDS_TOPIC = "broker-test-words"

app = faust.App(
    APP_ID,
    broker=f"kafka://{os.environ.get('BROKER_TEST_BOOTSTRAP', '127.0.0.1:19092')}",
    store="memory://",
    datadir=os.environ.get("BROKER_TEST_DATADIR", "faust-data"),
    web_enabled=False,
    topic_partitions=1,
    broker_commit_interval=0.5,
)
words = app.topic(WORDS_TOPIC, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
counts = app.Table("word-counts", default=int, partitions=1)


@app.agent(words)
async def count(stream):
    async for word in stream:
        text = word.decode()
        counts[text] += 1
        with open(os.environ["BROKER_TEST_OUT"], "a") as out:
            out.write(f"{text} {counts[text]}\n")


if __name__ == "__main__":
    app.main()
