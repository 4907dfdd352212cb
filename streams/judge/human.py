"""The human layer's I/O (reward layer 3): labels and calibration maps in and out of the stores.

- `read_labels`: a JSONL file of labels as validated `feedback.annotation` events, plus the rows
  that were rejected (path:line: reason);
- `publish`: events to their registry topics (`feedback.human` for labels and maps), each one
  acknowledged by the broker before it returns;
- `read_events` / `read_score_tables`: what `agentstream calibrate` pairs, read from the topics
  to their end at call time; `read_clickhouse`: the same from the tables the sink fills.

The pure parts sit beside it: labels and pairing in `annotations.py`, fitting, metrics and the
`calibration.updated` event in `calibration.py`. Kafka is reached through `clients.kafka`, so this
works against the embedded broker and Kafka alike. Nothing here prints: the CLI
(infra/commands/judge.py) shows the results.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from clients.kafka import ensure_topics, make_producer, read_to_end
from schemas.codec import decode, encode, encode_key
from schemas.errors import DecodeError
from schemas.events import EventBase, FeedbackAnnotation
from schemas.topics import AGENT_EVENTS, FEEDBACK_HUMAN, REWARD_JUDGE, TOPICS, topic_for
from streams.errors import AnnotationError
from streams.judge.annotations import ScoreTables, annotation_from_row

log = logging.getLogger(__name__)

CLIENT_ID = "agentstream-human"
ACK_TIMEOUT_S = 30.0
# What calibration pairs: episode starts (for the domain), judge scores and human labels.
CALIBRATION_TOPICS = (AGENT_EVENTS, REWARD_JUDGE, FEEDBACK_HUMAN)


def read_labels(path: str | Path) -> tuple[list[FeedbackAnnotation], list[str]]:
    """The valid labels of a JSONL file and one `path:line: reason` per rejected row."""
    path = Path(path)
    if not path.is_file():
        raise AnnotationError(f"labels file {path} does not exist")
    events, rejected = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            events.append(annotation_from_row(json.loads(line)))
        except (ValueError, AnnotationError) as exc:
            rejected.append(f"{path}:{number}: {exc}")
    return events, rejected


def publish(bootstrap_servers: str, events: Sequence[EventBase]) -> None:
    """Publish `events` to their topics (created if missing); returns once every one is
    acknowledged, raises if the broker refused one."""
    if not events:
        return
    names = sorted({topic_for(e.type) for e in events})
    ensure_topics(bootstrap_servers, [TOPICS[name] for name in names])
    producer = make_producer(bootstrap_servers, CLIENT_ID)
    try:
        futures = [producer.send(topic_for(e.type), key=encode_key(e), value=encode(e)) for e in events]
        producer.flush()
        for future in futures:
            future.get(timeout=ACK_TIMEOUT_S)
    finally:
        producer.close()


def read_events(bootstrap_servers: str, topics: Iterable[str], timeout_s: float = 30.0) -> list[EventBase]:
    """Every decodable event on `topics` up to their end offsets at call time; undecodable records
    are counted in the log (the dead-letter topic has them), not returned."""
    events, bad = [], 0
    for record in read_to_end(bootstrap_servers, list(topics), timeout_s):
        try:
            events.append(decode(record.value))
        except DecodeError:
            bad += 1
    if bad:
        log.warning("read_events: %d undecodable record(s) skipped", bad)
    return events


def read_score_tables(bootstrap_servers: str, timeout_s: float = 30.0) -> ScoreTables:
    """Episode domains, judge scores and human labels, from the topics."""
    return ScoreTables.from_events(read_events(bootstrap_servers, CALIBRATION_TOPICS, timeout_s))


def read_clickhouse(url: str) -> ScoreTables:
    """Episode domains, judge scores and human labels, from the ClickHouse tables the sink fills."""
    from clients.clickhouse.client import connect

    client = connect(url, wait_s=10.0)
    tables = ScoreTables()
    rows = client.query("SELECT trajectory_id, any(domain) FROM agentstream.episodes GROUP BY trajectory_id")
    tables.domains = {tid: domain or "generic" for tid, domain in rows.result_rows}
    judged = client.query(
        "SELECT trajectory_id, kind, step_index, scores, score FROM agentstream.judge_scores FINAL "
        "WHERE kind IN ('step', 'trajectory') ORDER BY occurred_at"
    )
    for tid, kind, step_index, scores, score in judged.result_rows:
        if kind == "step" and step_index is not None:
            tables.steps[(tid, int(step_index))] = (dict(scores), score)
        elif kind == "trajectory":
            tables.trajectories[tid] = (dict(scores), score)
    labels = client.query(
        "SELECT trajectory_id, step_index, rubric, score FROM agentstream.annotations FINAL"
    )
    for tid, step_index, rubric, score in labels.result_rows:
        tables.labels[(tid, None if step_index is None else int(step_index), rubric)].append(float(score))
    return tables
