"""`agentstream bench broker`: embedded-broker throughput with real clients, and crash recovery time.

Starts `agentstream broker` as a subprocess on a free port, once per flush policy (`always`: fsync
before every acknowledgement, the default; `interval`: the non-durable peer measured in the same
run), then for kafka-python and aiokafka and each message size produces
`--messages` records (acks=all, linger 5 ms) to a fresh one-partition topic and consumes them back
from the beginning, timing both. Figures are medians over `--repeats`. Recovery is measured by the
storage layer's `measure_recovery`: fill a partition log with `--recovery-bytes`, simulate kill -9
with a torn final batch, time the reopen (CRC scan and truncation of the tail).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import tempfile
import time
from pathlib import Path

from infra.runtime import agentstream_argv, stop_child

log = logging.getLogger(__name__)

CLIENTS = ("kafka-python", "aiokafka")
CLIENT_ID = "bench-broker"


def add_arguments(parser) -> None:
    parser.add_argument("--messages", type=int, default=50_000, help="messages per run (200 B runs)")
    parser.add_argument(
        "--sizes",
        default="200,2048",
        help="comma-separated message sizes in bytes (sizes above 200 B send a quarter of --messages)",
    )
    parser.add_argument(
        "--flush",
        default="always,interval",
        help="comma-separated broker flush policies to compare (always: fsync before every ack)",
    )
    parser.add_argument(
        "--recovery-bytes",
        type=int,
        default=1_000_000_000,
        help="log size for the kill -9 recovery measurement (0: skip)",
    )
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated: kafka-python,aiokafka")


def run(args) -> dict:
    from infra.bench.report import machine

    sizes = [int(s) for s in str(args.sizes).split(",") if s]
    clients = [c for c in str(args.clients).split(",") if c]
    policies = [p for p in str(args.flush).split(",") if p]
    rows = []
    with tempfile.TemporaryDirectory(prefix="agentstream-bench-broker-") as scratch:
        for policy in policies:
            with BrokerProcess(Path(scratch) / f"broker-{policy}", policy) as bootstrap:
                for client in clients:
                    for size in sizes:
                        count = _count_for(args.messages, size)
                        rows.append(
                            {"flush": policy, **_measure(bootstrap, client, size, count, args.repeats)}
                        )
        recovery = _recovery(Path(scratch) / "recovery", args.recovery_bytes)
    if recovery:
        rows.append({"flush": "-", **_recovery_row(recovery)})
    return {"rows": rows, "recovery": recovery, "machine": machine()}


def _count_for(messages: int, size: int) -> int:
    """A quarter of the messages for sizes above 200 B (a 2 KB run still moves ~25 MB by default)."""
    return messages if size <= 200 else max(1000, messages // 4)


class BrokerProcess:
    """`agentstream broker` on a free port for the duration of a `with` block."""

    def __init__(self, data_dir: Path, flush: str):
        self.data_dir, self.flush = data_dir, flush
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> str:
        self.data_dir.mkdir(parents=True)
        ready = self.data_dir / "ready"
        args = agentstream_argv("broker", "--data-dir", str(self.data_dir))
        args += ["--port", "0", "--ready-file", str(ready), "--flush", self.flush, "--log-level", "WARNING"]
        self.proc = subprocess.Popen(args)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start (exit code {self.proc.poll()})")
            time.sleep(0.05)
        return ready.read_text().strip()

    def __exit__(self, *exc) -> None:
        stop_child(self.proc, grace_s=20)


def _measure(bootstrap: str, client: str, size: int, count: int, repeats: int) -> dict:
    from infra.bench.report import median

    produce_rates, consume_rates = [], []
    for attempt in range(max(1, repeats)):
        topic = f"bench-{client}-{size}-{attempt}"
        _create_topic(bootstrap, topic)
        produce_s, consume_s = RUNNERS[client](bootstrap, topic, size, count)
        produce_rates.append(count / produce_s)
        consume_rates.append(count / consume_s)
    produce, consume = median(produce_rates), median(consume_rates)
    log.info("%s %d B: produce %.0f msg/s, consume %.0f msg/s", client, size, produce, consume)
    return {
        "client": client,
        "message_bytes": size,
        "messages": count,
        "produce_msgs_s": round(produce),
        "produce_MB_s": round(produce * size / 1e6, 1),
        "consume_msgs_s": round(consume),
        "consume_MB_s": round(consume * size / 1e6, 1),
    }


def _create_topic(bootstrap: str, topic: str) -> None:
    from kafka.admin import NewTopic

    from clients.kafka import make_admin

    admin = make_admin(bootstrap, CLIENT_ID)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()


def _kafka_python(bootstrap: str, topic: str, size: int, count: int) -> tuple[float, float]:
    # Each client's own settings (project_limits=False): this measures the broker, the same for the
    # embedded broker and its peer, whatever the project's limits become.
    from kafka import TopicPartition

    from clients.kafka import make_consumer, make_producer

    payload = b"x" * size
    producer = make_producer(bootstrap, CLIENT_ID, project_limits=False, acks="all", linger_ms=5)
    start = time.perf_counter()
    for _ in range(count):
        producer.send(topic, payload)
    producer.flush()
    produce_s = time.perf_counter() - start
    producer.close()

    consumer = make_consumer(bootstrap, CLIENT_ID)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    seen, start = 0, time.perf_counter()
    while seen < count:  # a raw poll loop on purpose: this measures the client, not clients.kafka
        for batch in consumer.poll(timeout_ms=1000, max_records=100_000).values():
            seen += len(batch)
    consume_s = time.perf_counter() - start
    consumer.close()
    return produce_s, consume_s


def _aiokafka(bootstrap: str, topic: str, size: int, count: int) -> tuple[float, float]:
    return asyncio.run(_aiokafka_async(bootstrap, topic, size, count))


async def _aiokafka_async(bootstrap: str, topic: str, size: int, count: int) -> tuple[float, float]:
    from aiokafka import TopicPartition

    from clients.kafka import make_async_consumer, make_async_producer

    payload = b"x" * size
    producer = make_async_producer(bootstrap, CLIENT_ID, project_limits=False, acks="all", linger_ms=5)
    await producer.start()
    start = time.perf_counter()
    for _ in range(count):
        await producer.send(topic, payload)
    await producer.flush()
    produce_s = time.perf_counter() - start
    await producer.stop()

    consumer = make_async_consumer(bootstrap, CLIENT_ID)
    await consumer.start()
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    seen, start = 0, time.perf_counter()
    while seen < count:  # a raw getmany loop on purpose: this measures the client, not clients.kafka
        for batch in (await consumer.getmany(timeout_ms=1000, max_records=100_000)).values():
            seen += len(batch)
    consume_s = time.perf_counter() - start
    await consumer.stop()
    return produce_s, consume_s


RUNNERS = {"kafka-python": _kafka_python, "aiokafka": _aiokafka}


def _recovery(directory: Path, total_bytes: int) -> dict | None:
    if total_bytes <= 0:
        return None
    from infra.bench.broker_recovery import measure_recovery

    directory.mkdir(parents=True)
    return measure_recovery(directory, total_bytes)


def _recovery_row(recovery: dict) -> dict:
    """The recovery figure as a table row (the full measurement is in the JSON under `recovery`)."""
    seconds, gigabytes = recovery.get("recovery_warm_s"), recovery.get("total_bytes", 0) / 1e9
    full_scan = recovery.get("full_crc_scan_s")
    scan = f"; CRC scan of every segment: {full_scan} s" if full_scan is not None else ""
    correct = recovery.get("correct")
    return {
        "client": f"kill -9 recovery of {gigabytes:.2f} GB: {seconds} s{scan} (correct={correct})",
        "message_bytes": recovery.get("batch_bytes"),
        "messages": recovery.get("records"),
        "produce_msgs_s": None,
        "produce_MB_s": None,
        "consume_msgs_s": None,
        "consume_MB_s": recovery.get("recovery_mb_s"),
    }
