"""A small faust app for the broker tests: counts words from a topic into a changelogged table.

Run as a real worker: `python -m tests.support.faust_app worker -l info` with
BROKER_TEST_BOOTSTRAP (host:port), BROKER_TEST_OUT (a file: one "word count" line per event) and
BROKER_TEST_DATADIR (faust's state directory) in the environment; BROKER_TEST_DELIVERED (a file)
gets every offset faust delivers to the agent. The table lives in memory, so a
restarted worker can only know earlier counts by replaying the changelog from the broker.
"""

from __future__ import annotations

import os

from streams.faust_compat import committed_offsets, import_faust
from streams.offsets import OffsetContinuity

faust = import_faust()  # the workers' faust code path (see there)

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
    broker_session_timeout=10.0,  # a worker that exits on a gap is out of the group in 10 s, not 60
    broker_heartbeat_interval=2.0,
)
words = app.topic(WORDS_TOPIC, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
counts = app.Table("word-counts", default=int, partitions=1)


GAP_EXIT_CODE = 70
NEXT_OFFSET = "next-offset"  # the table's own key: the offset after the last one counted


@app.agent(words)
async def count(stream):
    continuity = OffsetContinuity()  # the workers' guard (streams/offsets.py)
    committed = committed_offsets(app)
    async for event in stream.events():
        msg = event.message
        record = (msg.generation_id, msg.topic, msg.partition, msg.offset)
        if continuity.check([record], lambda topic, partition: committed.get((topic, partition))):
            os._exit(GAP_EXIT_CODE)  # faust lost a record: exit before acking anything after it
        with open(os.environ["BROKER_TEST_DELIVERED"], "a") as delivered:
            delivered.write(f"{msg.offset}\n")
        if msg.offset < counts[NEXT_OFFSET]:
            continue  # faust re-delivered it (it may rewind around a restart): counted already
        text = event.value.decode()
        counts[text] += 1
        counts[NEXT_OFFSET] = msg.offset + 1  # in the table, so the changelog restores it too
        with open(os.environ["BROKER_TEST_OUT"], "a") as out:
            out.write(f"{text} {counts[text]}\n")


if __name__ == "__main__":
    app.main()
