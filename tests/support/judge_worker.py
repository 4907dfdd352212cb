"""Running the judge role of `agentstream worker` in tests: produce agent events, read a topic back,
start the worker process against a local judge server (stopped by PID by the caller)."""

from __future__ import annotations

from pathlib import Path

from schemas.codec import decode
from tests.support.processes import AGENTSTREAM, Proc
from tests.support.sink_harness import publish


def produce(bootstrap: str, events) -> None:
    """Publish agent events (acks=all), keyed by trajectory."""
    publish(bootstrap, events)


class TopicReader:
    """Every event of a topic from the start, decoded; `poll` adds what has arrived since."""

    def __init__(self, bootstrap: str, topic: str):
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        self.events = []

    def poll(self):
        for records in self.consumer.poll(timeout_ms=200).values():
            self.events += [decode(r.value) for r in records]
        return self.events

    def close(self) -> None:
        self.consumer.close()


def judge_worker(
    bootstrap: str, tmp_path: Path, env: dict[str, str], *args: str, name: str = "worker"
) -> Proc:
    """`agentstream worker --roles judge` with `env` (the judge's settings) and extra CLI `args`.
    The caller's environment may not choose the judge's key or rules: those come from `env` only."""
    clean = {
        "AGENTSTREAM_JUDGE_RULES_PATH": "",
        "AGENTSTREAM_JUDGE_API_KEY": "",
        "ANTHROPIC_API_KEY": "",
        "OPENAI_API_KEY": "",
        "AGENTSTREAM_JUDGE_BACKOFF_BASE_S": "0.05",
    }
    command = [*AGENTSTREAM, "worker", "--roles", "judge", "--bootstrap-servers", bootstrap]
    command += ["--data-dir", str(tmp_path / "data"), "--log-level", "INFO", *args]
    return Proc(command, tmp_path / f"{name}.log", {**clean, **env})
