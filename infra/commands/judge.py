"""`agentstream annotate` and `agentstream calibrate` (the human layer). Handlers import lazily.

- `annotate --trajectory ID [--step N] --rubric R --score S [--annotator A] [--comment C]`, or
  `annotate --import FILE.jsonl`: publish `feedback.annotation` events to `feedback.human`.
- `calibrate [--domain D] [--publish] [--plot PATH]`: read episode starts, judge scores and
  annotations from the topics (works the same against the embedded broker and Kafka), report
  agreement per (domain, rubric), fit isotonic maps, and with `--publish` publish them as
  `calibration.updated` on `feedback.human`, where the assembler picks up the newest.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from infra.cli.options import add_option, command_parser

log = logging.getLogger(__name__)


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""
    parser = command_parser(sub, "annotate", annotate, "publish human labels (feedback.human)")
    add_option(parser, "--trajectory", help="trajectory id of the label")
    add_option(parser, "--step", type=int, help="step index (leave out for a trajectory-level label)")
    add_option(parser, "--rubric", default="overall", help="rubric id the label scores")
    add_option(parser, "--score", type=float, help="human score, 0..1")
    add_option(parser, "--annotator", default="", help="who labelled")
    add_option(parser, "--comment", default="", help="free text")
    add_option(parser, "--import", dest="import_path", help="JSONL file of labels to publish instead")

    parser = command_parser(
        sub,
        "calibrate",
        calibrate,
        "fit judge->human calibration maps and report agreement",
    )
    add_option(parser, "--domain", help="only this domain")
    add_option(
        parser, "--min-pairs", type=int, default=10, help="labels needed to fit a (domain, rubric) map"
    )
    add_option(
        parser, "--publish", action="store_true", default=False, help="publish the maps (calibration.updated)"
    )
    add_option(parser, "--plot", help="write a PNG reliability plot here")
    add_option(parser, "--read-timeout", type=float, default=30.0, help="seconds to read the topics")
    add_option(
        parser,
        "--source",
        choices=("topics", "clickhouse"),
        default="topics",
        help="read scores and labels from the topics, or from ClickHouse (--clickhouse-url; faster at scale)",
    )


# --- annotate -------------------------------------------------------------------------------------


def annotate(args) -> int:
    from streams.judge.annotations import AnnotationError, annotation_event

    if args.import_path:
        events, errors = _read_labels(Path(args.import_path))
    else:
        if not args.trajectory or args.score is None:
            raise AnnotationError("--trajectory and --score are required (or use --import FILE.jsonl)")
        events = [
            annotation_event(
                args.trajectory, args.rubric, args.score, args.step, args.annotator, args.comment
            )
        ]
        errors = []
    bootstrap = _bootstrap(args)
    if events:
        _publish(bootstrap, events)
    print(f"published {len(events)} annotation(s) to feedback.human")
    for error in errors:
        print(f"rejected: {error}")
    return 1 if errors else 0


def _read_labels(path: Path):
    from streams.judge.annotations import AnnotationError, annotation_from_row

    if not path.exists():
        raise AnnotationError(f"--import: no such file {str(path)!r}")
    events, errors = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            events.append(annotation_from_row(json.loads(line)))
        except (ValueError, AnnotationError) as exc:
            errors.append(f"{path}:{number}: {exc}")
    return events, errors


def _bootstrap(args) -> str:
    from schemas.settings import Settings

    return Settings.from_args(args).bootstrap_servers


def _publish(bootstrap: str, events) -> None:
    from kafka import KafkaProducer

    from clients.kafka import ensure_topics
    from schemas.codec import encode, encode_key
    from schemas.topics import FEEDBACK_HUMAN, TOPICS, topic_for

    ensure_topics(bootstrap, [TOPICS[FEEDBACK_HUMAN]])
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=5)
    try:
        futures = [producer.send(topic_for(e.type), key=encode_key(e), value=encode(e)) for e in events]
        producer.flush()
        for future in futures:
            future.get(timeout=30)  # raises if the broker did not acknowledge
    finally:
        producer.close()


# --- calibrate ------------------------------------------------------------------------------------


def calibrate(args) -> int:
    from schemas.topics import AGENT_EVENTS, FEEDBACK_HUMAN, REWARD_JUDGE
    from streams.judge.annotations import ScoreTables, pair_tables
    from streams.judge.calibration import CalibrationError, fit_calibration, reliability_plot, report_rows

    bootstrap = _bootstrap(args)
    if args.source == "clickhouse":
        tables = read_clickhouse(_clickhouse_url(args))
    else:
        events = read_topics(bootstrap, [AGENT_EVENTS, REWARD_JUDGE, FEEDBACK_HUMAN], args.read_timeout)
        tables = ScoreTables.from_events(events)
    pairs = pair_tables(tables, args.domain)
    results, skipped = [], []
    for (domain, rubric), matched in sorted(pairs.by_key.items()):
        if len(matched) < max(2, args.min_pairs):
            skipped.append(f"{domain}/{rubric}: {len(matched)} label(s), need {args.min_pairs}")
            continue
        auto, human = [a for a, _ in matched], [h for _, h in matched]
        try:
            results.append(fit_calibration(auto, human, domain=domain, rubric=rubric))
        except CalibrationError as exc:
            skipped.append(f"{domain}/{rubric}: {exc}")
    _print_report(report_rows(results), skipped, pairs.unmatched)
    if args.plot and results:
        print(f"reliability plot: {reliability_plot(results, args.plot)}")
    if args.publish and results:
        _publish(bootstrap, [calibration_event(r) for r in results])
        print(f"published {len(results)} calibration map(s) to feedback.human")
    return 0


def calibration_event(result):
    """The `calibration.updated` event of a fit (id derived from its version)."""
    from schemas.events import CalibrationUpdated, utc_now
    from schemas.ids import derived_event_id

    cmap = result.map
    return CalibrationUpdated(
        event_id=derived_event_id("calibration.updated", cmap.version),
        trajectory_id=f"calibration:{cmap.domain}:{cmap.rubric}",
        occurred_at=utc_now(),
        producer="agentstream-calibrate",
        version=cmap.version,
        domain=cmap.domain,
        rubric=cmap.rubric,
        xs=cmap.xs,
        ys=cmap.ys,
        metrics=result.metrics,
        n=result.n,
    )


def _print_report(rows, skipped, unmatched: int) -> None:
    from infra.bench.report import format_table

    print(format_table(rows) if rows else "no (domain, rubric) with enough labels to calibrate")
    for line in skipped:
        print(f"skipped {line}")
    if unmatched:
        print(f"{unmatched} label(s) had no judge score to compare with")


def _clickhouse_url(args) -> str:
    from schemas.settings import Settings

    return Settings.from_args(args).resolved_clickhouse_url


def read_clickhouse(url: str):
    """Judge scores, labels and episode domains from the ClickHouse tables the sink fills."""
    from clients.clickhouse.client import connect
    from streams.judge.annotations import ScoreTables

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


def read_topics(bootstrap: str, topics: list[str], timeout_s: float = 30.0) -> list:
    """Every decodable event on `topics` up to their end offsets at call time (undecodable ones are
    counted and logged, not returned)."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    from schemas.codec import decode
    from schemas.errors import DecodeError

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        parts = [TopicPartition(t, p) for t in topics for p in (consumer.partitions_for_topic(t) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        events, bad = [], 0
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in parts):
            if time.monotonic() > deadline:
                log.warning("calibrate: stopped reading after %.0fs; results cover what was read", timeout_s)
                break
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    try:
                        events.append(decode(record.value))
                    except DecodeError:
                        bad += 1
        if bad:
            log.warning("calibrate: %d undecodable record(s) skipped (the DLQ has them)", bad)
        return events
    finally:
        consumer.close()
