"""A one-role faust app on the real batch shell (streams/shell.py) with a test processor, for the
shell's poison path (issue #34): run as a real worker subprocess against the embedded broker.

Run: `python -m tests.support.poison_app worker -l info` with, in the environment,
POISON_TEST_BOOTSTRAP (host:port), POISON_TEST_DATADIR (faust's state directory), POISON_TEST_CALLS
(a file: one line per call of the processor, the offsets it was given) and POISON_TEST_FLAKY (a
path: while that file exists, a record of trajectory `flaky*` raises ConnectionError).

The processor turns each `step.recorded` of `SOURCE_TOPIC` into one `reward.rule.step` (event id
`reward:<step event id>`) and the step's trajectory id into a state-table entry. A step of trajectory
`poison*` raises a plain ValueError (the record's fault); one of `unencodable*` returns an output
that cannot be encoded (the shell's encoding raises, also the record's fault); `flaky*` raises
ConnectionError while POISON_TEST_FLAKY exists (the world's fault: retryable).
"""

from __future__ import annotations

import os

from schemas.events import RuleRewardStep, StepRecorded
from schemas.records import Record
from streams.batch import BatchResult, decode_records
from streams.faust_compat import import_faust
from streams.shell import BatchShell

faust = import_faust()  # the workers' faust code path (see there)

APP_ID = "shell-poison-test"
SOURCE_TOPIC = "shell-poison-test.in"
STAGE = "poison-test"
SESSION_TIMEOUT_S = 6.0  # the restarted worker waits out the exited one's session

app = faust.App(
    APP_ID,
    broker=f"kafka://{os.environ.get('POISON_TEST_BOOTSTRAP', '127.0.0.1:19092')}",
    store="memory://",
    datadir=os.environ.get("POISON_TEST_DATADIR", "faust-data"),
    key_serializer="raw",
    value_serializer="raw",
    web_enabled=False,
    topic_partitions=1,
    topic_replication_factor=1,
    producer_acks=-1,
    broker_commit_interval=0.2,  # the test waits for the commit: keep it short
    broker_session_timeout=SESSION_TIMEOUT_S,
    broker_heartbeat_interval=1.0,
    consumer_auto_offset_reset="earliest",
    stream_wait_empty=False,
    stream_recovery_delay=0.0,
)


def process(records: list[Record], get_state) -> BatchResult:
    """The test double: one reward per step, raising on the chosen trajectories (see the module)."""
    with open(os.environ["POISON_TEST_CALLS"], "a") as calls:
        calls.write(" ".join(str(r.offset) for r in records) + "\n")
    result = BatchResult()
    for record, event in decode_records(STAGE, records, {SOURCE_TOPIC: {"step.recorded"}}, result):
        assert isinstance(event, StepRecorded)
        tid = event.trajectory_id
        if tid.startswith("poison"):
            raise ValueError(f"{tid}: this record is poison")
        if tid.startswith("flaky") and os.path.exists(os.environ["POISON_TEST_FLAKY"]):
            raise ConnectionError(f"{tid}: the world is down")
        reward = RuleRewardStep(
            event_id=f"reward:{event.event_id}",
            trajectory_id=tid,
            occurred_at=event.occurred_at,
            producer=STAGE,
            step_index=event.step_index,
            reward_version="test",
            source_event_id=event.event_id,
        )
        if tid.startswith("unencodable"):
            # built without validation, as a processor bug would: the serializer refuses the object
            reward = RuleRewardStep.model_construct(**{**dict(reward), "domain": object()})
        result.outputs.append(reward)
        result.updates[tid.encode()] = str(record.offset).encode()
    return result


shell = BatchShell(app, STAGE, partitions=1)
source = shell.source(SOURCE_TOPIC)
shell.consume_in_batches(source, 10_000, lambda records: process(records, shell.get()))


@app.agent(source, name=STAGE)
async def poison_test(stream):
    await shell.hold(stream)  # subscribes; the batches come through consume_in_batches


if __name__ == "__main__":
    app.main()
