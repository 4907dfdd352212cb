"""`agentstream ingest PATH...`: convert agent logs on disk and publish them to `agent.events`.

The pure part is `convert_file` (bytes -> events and rejections, no I/O). `ingest` is the shell: it
walks the paths, reads each file, publishes its events with a kafka-python producer (acks=all,
keyed by trajectory id, one in-flight request so a trajectory stays in order), sends every rejected
file or record to the dead-letter topic (stage "ingest", the file path as source key) and returns a
summary. The command (`infra/commands/ingest.py`) shows progress and the summary, and exits 1 when
anything was rejected or could not be published; the valid files of the same run still land.

Redaction: events and dead letters pass the process's redactor (`producers.redaction`, configured
by the settings file) before they are published; a dry run publishes nothing and redacts nothing.

Idempotent: event ids depend only on the format, the file's bytes and positions inside it, so
ingesting a file again re-publishes the same ids (sinks deduplicate on event_id).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from producers.adapters.agentstream_jsonl import ReadyEvents
from producers.adapters.contract import Rejection, load_document
from producers.adapters.detect import FORMATS, adapter_for, detect_format
from producers.adapters.events import Overrides, build_events
from producers.errors import AdapterError
from producers.redaction import Redactor
from producers.redaction_settings import load_redactor, settings_file_option
from schemas.codec import field_errors
from schemas.events import EventBase

log = logging.getLogger(__name__)

STAGE = "ingest"
SUFFIXES = (".json", ".jsonl", ".traj")
DLQ_PAYLOAD_LIMIT = 512 * 1024  # bytes of a rejected file kept in its dead letter


@dataclass
class FileReport:
    """What became of one input file."""

    path: Path
    format: str | None = None
    events: list[EventBase] = field(default_factory=list)
    episodes: int = 0
    steps: int = 0
    rejections: list[Rejection] = field(default_factory=list)
    published: bool = False
    publish_error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.rejections and self.publish_error is None

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "episodes": self.episodes,
            "steps": self.steps,
            "events": len(self.events),
            "published": self.published,
            "rejected": [{"where": r.where, "reason": r.reason} for r in self.rejections],
            "publish_error": self.publish_error,
        }


def convert_file(
    path: Path, data: bytes, mtime: datetime, fmt: str = "auto", overrides=Overrides()
) -> FileReport:
    """Decode, detect and convert one file (pure). A file-level problem is one rejection naming it."""
    report = FileReport(path)
    try:
        doc = load_document(path, data, mtime)
        report.format = detect_format(doc) if fmt == "auto" else fmt
        for item in adapter_for(report.format).parse(doc):
            _take(report, item, doc, overrides)
        if not report.events and not report.rejections:
            raise AdapterError(f"{path}: no episodes found in this {report.format} file")
    except AdapterError as exc:
        reason = str(exc)
        report.rejections.append(
            Rejection(str(path), reason if reason.startswith(str(path)) else f"{path}: {reason}")
        )
        report.events, report.episodes, report.steps = [], 0, 0
    return report


def _take(report: FileReport, item, doc, overrides: Overrides) -> None:
    if isinstance(item, Rejection):
        report.rejections.append(item)
    elif isinstance(item, ReadyEvents):
        report.events.extend(item.events)
        report.episodes += sum(1 for e in item.events if e.type == "episode.started")
        report.steps += sum(1 for e in item.events if e.type == "step.recorded")
    else:
        try:
            events = build_events(item, doc, report.format, overrides)
        except ValidationError as exc:  # out of the contract's bounds (a 200,000-step log, a huge id)
            reason = "; ".join(str(e) for e in field_errors(exc))
            where = f"{doc.path}: episode {item.key}"
            report.rejections.append(Rejection(where, f"{where}: out of bounds: {reason}"))
            return
        report.events.extend(events)
        report.episodes += 1
        report.steps += len(item.steps)


def collect_paths(paths: list[str]) -> tuple[list[Path], list[Path], list[str]]:
    """(files to read, files in directories skipped for their suffix, paths that do not exist)."""
    files: list[Path] = []
    skipped: list[Path] = []
    missing: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for child in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")):
                (files if child.name.endswith(SUFFIXES) else skipped).append(child)
        elif path.is_file():
            files.append(path)
        else:
            missing.append(raw)
    unique = list(dict.fromkeys(files))
    return unique, skipped, missing


def summarize(
    reports: list[FileReport], skipped: list[Path], dry_run: bool, dead_letters: int
) -> dict[str, Any]:
    return {
        "files": len(reports),
        "files_ok": sum(1 for r in reports if r.ok),
        "files_rejected": sum(1 for r in reports if not r.ok),
        "episodes": sum(r.episodes for r in reports),
        "steps": sum(r.steps for r in reports),
        "events": sum(len(r.events) for r in reports),
        "events_published": 0 if dry_run else sum(len(r.events) for r in reports if r.published),
        "rejected": sum(len(r.rejections) + (r.publish_error is not None) for r in reports),
        "dead_letters": dead_letters,
        "dry_run": dry_run,
        "skipped_by_suffix": [str(p) for p in skipped],
        "per_file": [r.as_dict() for r in reports],
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The human summary printed at the end of a run."""
    lines = [
        f"ingest: {summary['files']} files ({summary['files_ok']} ok, "
        f"{summary['files_rejected']} with rejections), "
        f"{summary['episodes']} episodes, {summary['steps']} steps, {summary['events']} events"
        + (
            " (dry run: nothing published)"
            if summary["dry_run"]
            else f", {summary['events_published']} published"
        )
    ]
    for item in summary["per_file"]:
        status = "ok" if not item["rejected"] and not item["publish_error"] else "REJECTED"
        if item["events"] and item["rejected"]:
            status = "PARTIAL"
        lines.append(
            f"  {status:<8} {item['path']}  [{item['format'] or '?'}] "
            f"{item['episodes']} episodes, {item['steps']} steps"
        )
        lines += [f"           - {r['reason']}" for r in item["rejected"]]
        if item["publish_error"]:
            lines.append(f"           - not published: {item['publish_error']}")
    if summary["skipped_by_suffix"]:
        lines.append(
            f"  skipped {len(summary['skipped_by_suffix'])} files in directories (suffix not {SUFFIXES})"
        )
    if summary["rejected"]:
        lines.append(
            f"rejected: {summary['rejected']} ({summary['dead_letters']} sent to the dead-letter topic)"
        )
    return "\n".join(lines)


# --- the shell ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IngestConfig:
    """One `agentstream ingest` run; documented fields are its options."""

    bootstrap_servers: str = ""
    format: str = field(
        default="auto",
        metadata={"help": "log format (auto: detected per file from its structure)", "choices": FORMATS},
    )
    domain: str = field(default="", metadata={"help": "domain for every episode (default: per format)"})
    agent: str = field(default="", metadata={"help": "agent name for every episode (default: from the log)"})
    model: str = field(default="", metadata={"help": "model name for every episode (default: from the log)"})
    dry_run: bool = field(default=False, metadata={"help": "convert and summarise, publish nothing"})
    settings_file: str | None = settings_file_option()


def ingest(
    paths: list[str], config: IngestConfig, progress: Callable[[list[Path]], Iterable[Path]] = iter
) -> dict[str, Any]:
    """Convert the files under `paths` and publish them (unless `dry_run`); returns the summary
    (`summarize`). `progress` wraps the list of files (the command shows a progress bar with it)."""
    files, skipped, missing = collect_paths(paths)
    overrides = Overrides(domain=config.domain, agent=config.agent, model=config.model)
    publisher = None if config.dry_run else Publisher(config.bootstrap_servers, _redactor(config))
    reports: list[FileReport] = [_missing_report(raw) for raw in missing]
    dead_letters = 0
    try:
        for path in progress(files):
            report = _read_and_convert(path, config.format, overrides)
            reports.append(report)
            if publisher is not None:
                dead_letters += publisher.deliver(report)
    finally:
        if publisher is not None:
            publisher.close()
    return summarize(reports, skipped, config.dry_run, dead_letters)


def succeeded(summary: dict[str, Any]) -> bool:
    """Whether a run read at least one file and rejected nothing."""
    return summary["rejected"] == 0 and summary["files"] > 0


def _redactor(config: IngestConfig) -> Redactor:
    from schemas.settings import Settings

    return load_redactor(config.settings_file, Settings().data_dir)


def _missing_report(raw: str) -> FileReport:
    return FileReport(Path(raw), rejections=[Rejection(raw, f"{raw}: no such file or directory")])


def _read_and_convert(path: Path, fmt: str, overrides: Overrides) -> FileReport:
    try:
        data = path.read_bytes()
        mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except OSError as exc:
        return FileReport(path, rejections=[Rejection(str(path), f"{path}: cannot read: {exc.strerror}")])
    return convert_file(path, data, mtime, fmt, overrides)


class Publisher:
    """kafka-python producer for converted events and dead letters (acks=all, ordered per key)."""

    def __init__(self, bootstrap_servers: str, redactor: Redactor | None = None, timeout_s: float = 30.0):
        from clients.kafka import ensure_topics, make_producer
        from schemas.topics import AGENT_EVENTS, DLQ, TOPICS

        self.timeout_s = timeout_s
        self.redactor = redactor or Redactor.default()
        try:
            ensure_topics(bootstrap_servers, [TOPICS[AGENT_EVENTS], TOPICS[DLQ]], timeout_s=timeout_s)
            self.producer = make_producer(
                bootstrap_servers, "agentstream-ingest", retries=5, max_in_flight_requests_per_connection=1
            )
        except Exception as exc:  # kafka-python raises several unrelated types for "no broker"
            raise AdapterError(
                f"--bootstrap-servers: cannot reach the broker at {bootstrap_servers!r}: {exc}"
            ) from exc

    def deliver(self, report: FileReport) -> int:
        """Publish the report's events, then its rejections as dead letters; returns dead letters sent."""
        if report.events:
            self._publish_events(report)
        return self._publish_rejections(report)

    def _publish_events(self, report: FileReport) -> None:
        from schemas.codec import encode, encode_key
        from schemas.topics import topic_for

        report.events = [self.redactor.redact_event(e) for e in report.events]
        try:
            futures = [
                self.producer.send(topic_for(e.type), key=encode_key(e), value=encode(e))
                for e in report.events
            ]
            self.producer.flush(timeout=self.timeout_s)
            for future in futures:
                future.get(timeout=self.timeout_s)
            report.published = True
        except Exception as exc:  # any send failure: the file is reported, never silently dropped
            report.publish_error = f"{type(exc).__name__}: {exc}"
            log.error("ingest: publishing %s failed: %s", report.path, report.publish_error)

    def _publish_rejections(self, report: FileReport) -> int:
        from schemas.codec import encode, encode_key
        from schemas.deadletter import dead_letter
        from schemas.topics import DLQ

        letters = [self._letter(report, r, dead_letter) for r in report.rejections]
        try:
            futures = [self.producer.send(DLQ, key=encode_key(d), value=encode(d)) for d in letters]
            self.producer.flush(timeout=self.timeout_s)
            for future in futures:
                future.get(timeout=self.timeout_s)
        except Exception as exc:
            log.error("ingest: dead letters for %s not delivered: %s", report.path, exc)
            report.publish_error = report.publish_error or f"dead letters not delivered: {exc}"
            return 0
        return len(letters)

    def _letter(self, report: FileReport, rejection: Rejection, dead_letter):
        if rejection.record is not None:
            payload = orjson.dumps(rejection.record, default=str)
        else:
            try:
                payload = report.path.read_bytes()
            except OSError:
                payload = b""
        reason = rejection.reason
        if len(payload) > DLQ_PAYLOAD_LIMIT:
            reason += f" (payload truncated to the first {DLQ_PAYLOAD_LIMIT} of {len(payload)} bytes)"
            payload = payload[:DLQ_PAYLOAD_LIMIT]
        reason, payload = self.redactor.redact_text(reason)[0], self.redactor.redact_bytes(payload)
        return dead_letter(STAGE, reason, payload, key=str(report.path), error_type="AdapterError")

    def close(self) -> None:
        self.producer.close(timeout=self.timeout_s)
