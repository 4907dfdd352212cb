"""`agentstream bench streams`: scoring throughput per worker (rule rewards and trajectory
assembly in one role), publish-to-reward latency at a sustained offered load, and a plain
one-event-at-a-time faust agent for comparison.

Runs everything for real: `agentstream broker` (subprocess, fresh data directory), `agentstream
worker --roles scoring` (subprocess), kafka-python producers and consumers.

- scoring steps/s: `--trajectories` x `--steps` steps (trajectories interleaved, each in order) are
  published while the worker is stopped; the worker is started and the rate is timed from the
  worker's "first batch" log line (start-up and table recovery excluded) to its last
  trajectory.scored; steps/s = trajectories/s x steps per trajectory. Repeated `--repeats` times
  (at most 3) with fresh trajectories; median.
- latency: with the scoring worker caught up, steps are published at `--rate` steps/s for
  `--duration` s; latency = the rule reward record's timestamp (set when the worker produced it)
  minus the step record's timestamp (set when the producer sent it); p50 / p99.
- baseline: the same rule logic in a plain faust agent (`async for event in stream`, state in a
  plain dict, one `await topic.send` per reward), run as
  `python -m infra.bench.streams baseline BOOTSTRAP DATA_DIR`, over the same published steps.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from infra.options.env import add_option
from infra.runtime import agentstream_argv, python_module_argv, stop_child
from schemas.records import Record

log = logging.getLogger(__name__)

CLIENT_ID = "bench-streams"  # the bench's own reads (counting outputs, latencies)

BASELINE_TOPIC = "bench.baseline.rewards"
BASELINE_APP = "agentstream-bench-baseline"
SESSION_WAIT_S = 11.0


def add_arguments(parser) -> None:
    parser.add_argument("--trajectories", type=int, default=2000, help="trajectories per throughput run")
    parser.add_argument("--steps", type=int, default=10, help="steps per trajectory")
    parser.add_argument("--rate", type=float, default=1000.0, help="offered load for latency (steps/s)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of offered load for latency")
    parser.add_argument("--broker-flush", default="always", help="broker flush policy: always | interval")
    add_option(parser, "--skip-baseline", action="store_true", help="do not run the plain faust agent")


def run(args) -> dict:
    from clients.kafka import ensure_topics
    from infra.bench.broker import BrokerProcess
    from infra.bench.report import median, percentile

    repeats = max(1, min(int(args.repeats), 3))
    rows, notes, raw = [], [], {}
    with tempfile.TemporaryDirectory(prefix="agentstream-bench-streams-") as scratch:
        scratch = Path(scratch)
        with BrokerProcess(scratch / "broker", args.broker_flush) as bootstrap:
            ensure_topics(bootstrap)
            scoring_rates = []
            for r in range(repeats):
                _publish_batch(bootstrap, f"r{r}", args.trajectories, args.steps)
                traj_rate = _measure_worker(
                    bootstrap, scratch, "scoring", "trajectory.scored", args.trajectories
                )
                scoring_rates.append(traj_rate * args.steps)
            raw["scoring_steps_per_s"] = scoring_rates
            latencies = _latency(bootstrap, scratch, args.rate, args.duration, args.steps)
            raw["latency_ms_count"] = len(latencies)
            name = "scoring (rules + assembly, batched)"
            rows.append(_row(name, median(scoring_rates), latencies, percentile))
            if not args.skip_baseline:
                base = _measure_baseline(bootstrap, scratch, args.trajectories, args.steps)
                raw["baseline_steps_per_s"] = base
                rows.append(
                    {"processor": "plain faust agent, per event, rules only (baseline)", "steps_per_s": base}
                )
                ratio = median(scoring_rates) / base
                notes.append(f"batched scoring (rules + assembly) / baseline (rules only) = {ratio:.1f}x")
    notes.append(
        f"{args.trajectories} trajectories x {args.steps} steps per run, {repeats} repeats (median); "
        f"latency at {args.rate:.0f} steps/s offered for {args.duration:.0f}s; "
        f"broker flush {args.broker_flush}"
    )
    return {"rows": rows, "notes": notes, "raw": raw}


def _row(name, rate, latencies, percentile) -> dict:
    return {
        "processor": name,
        "steps_per_s": rate,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
    }


# --- load ------------------------------------------------------------------------------------------

TOOLS = [
    ("read_file", {"file_path": "/src/a.py"}, "see src/util.py and my_var"),
    ("edit_file", {"file_path": "/src/a.py", "old_string": "a", "new_string": "b"}, "ok"),
    ("bash", {"command": "pytest"}, "3 passed"),
    ("grep", {"pattern": "foo"}, "src/m1.py: foo_bar"),
]


def _trajectory(tid: str, n_steps: int, rng: random.Random):
    from schemas.events import EpisodeEnded, EpisodeStarted, StepRecorded

    now = datetime.now(UTC)
    yield EpisodeStarted(
        event_id=f"{tid}:s", trajectory_id=tid, occurred_at=now, producer="bench", task_id=tid
    )
    for i in range(n_steps):
        tool, params, output = rng.choice(TOOLS)
        yield StepRecorded(
            event_id=f"{tid}:{i}",
            trajectory_id=tid,
            occurred_at=now,
            producer="bench",
            step_index=i,
            tool=tool,
            params={**params, "i": i % 3},
            observation=output,
        )
    yield EpisodeEnded(
        event_id=f"{tid}:e", trajectory_id=tid, occurred_at=now, producer="bench", success=True
    )


def _producer(bootstrap: str, linger_ms: int = 5):
    """The load generator's producer (the stream processors are what is measured, not this)."""
    from clients.kafka import make_producer

    return make_producer(bootstrap, "bench-streams-load", linger_ms=linger_ms)


def _publish_batch(bootstrap: str, tag: str, trajectories: int, steps: int) -> int:
    """Publish trajectories (each in order, interleaved by rounds); returns the number of steps."""
    from schemas.codec import encode, encode_key

    rng = random.Random(tag)
    gens = [_trajectory(f"{tag}-{i}", steps, rng) for i in range(trajectories)]
    prod = _producer(bootstrap)
    while gens:
        for g in list(gens):
            event = next(g, None)
            if event is None:
                gens.remove(g)
                continue
            prod.send("agent.events", key=encode_key(event), value=encode(event))
    prod.flush(timeout=120)
    prod.close()
    return trajectories * steps


def _count(consumer, topic: str) -> int:
    from clients.kafka.ranges import topic_partitions

    parts = topic_partitions(consumer, [topic])
    return sum(consumer.end_offsets(parts).values()) if parts else 0


def _worker(bootstrap: str, scratch: Path, role: str) -> subprocess.Popen:
    args = agentstream_argv("worker", "--roles", role, "--bootstrap-servers", bootstrap)
    args += ["--data-dir", str(scratch / "worker"), "--log-level", "INFO", "--grace-seconds", "600"]
    log_file = open(scratch / f"{role}.log", "ab")  # noqa: SIM115 - owned by the child process
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # "first batch" must reach the log at once
    return subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=env)


def _stop(proc: subprocess.Popen) -> None:
    stop_child(proc, grace_s=15)
    # Let the stopped member's 10 s session expire before the next worker joins its group: the
    # embedded broker answers a member joining a stable group from the stable state (no rebalance),
    # which leaves the newcomer without partitions (reported to the broker owners).
    time.sleep(SESSION_WAIT_S)


def _rate_of(bootstrap: str, topic: str, expected: int, timeout_s: float = 300.0, ready=None) -> float:
    """Outputs/s on `topic` until `expected` more have appeared, timed from `ready()` turning true
    (the worker starts its first batch), else from the first new output."""
    from clients.kafka import make_consumer

    consumer = make_consumer(bootstrap, CLIENT_ID)
    try:
        base = _count(consumer, topic)
        deadline = time.monotonic() + timeout_s
        first_t = first_n = None
        n = 0
        while time.monotonic() < deadline:
            n = _count(consumer, topic) - base
            now = time.monotonic()
            if first_t is None and (ready() if ready else n > 0):
                first_t, first_n = now, (0 if ready else n)
            if n >= expected and first_t is not None:
                return (n - first_n) / max(now - first_t, 1e-3)
            time.sleep(0.05)
        log.warning(
            "%s: only %d of %d outputs after %.0fs; rate over what arrived", topic, n, expected, timeout_s
        )
        return (n - (first_n or 0)) / max(time.monotonic() - (first_t or time.monotonic()), 1e-3)
    finally:
        consumer.close()


def _measure_worker(bootstrap: str, scratch: Path, role: str, topic: str, expected: int) -> float:
    log_path = scratch / f"{role}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    proc = _worker(bootstrap, scratch, role)

    def ready() -> bool:
        with open(log_path, "rb") as f:
            f.seek(offset)
            return b": first batch:" in f.read()

    try:
        rate = _rate_of(bootstrap, topic, expected, ready=ready)
        _wait_committed(bootstrap, f"agentstream-{role}")
        return rate
    finally:
        _stop(proc)


def _wait_committed(bootstrap: str, group: str, timeout_s: float = 60.0) -> None:
    """Until `group` has committed the end of every partition it consumes. A worker stopped before
    that replays its uncommitted tail in the next run (same ids, but more records), and counting
    records would then end that run's measurement before its new input was processed."""
    from clients.kafka import make_admin, make_consumer

    admin = make_admin(bootstrap, CLIENT_ID)
    consumer = make_consumer(bootstrap, CLIENT_ID)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            committed = {
                tp: meta.offset for tp, meta in admin.list_group_offsets(group).get(group, {}).items()
            }
            ends = consumer.end_offsets(list(committed)) if committed else {}
            if committed and all(committed[tp] >= end for tp, end in ends.items()):
                return
            time.sleep(0.2)
        log.warning("%s: offsets not committed to the end after %.0fs", group, timeout_s)
    finally:
        consumer.close()
        admin.close()


def _latency(bootstrap: str, scratch: Path, rate: float, duration: float, steps: int) -> list[float]:
    """Publish at `rate` steps/s with a caught-up scoring worker; ms from step send to rule reward send."""
    from clients.kafka import make_consumer
    from schemas.codec import encode, encode_key

    proc = _worker(bootstrap, scratch, "scoring")
    try:
        _publish_batch(bootstrap, "warm", 20, steps)
        _rate_of(bootstrap, "reward.rule", 20 * steps)  # the worker is up and caught up
        consumer = make_consumer(bootstrap, CLIENT_ID)
        base = _count(consumer, "reward.rule")
        rng = random.Random("latency")
        n_traj = max(1, int(rate * duration / steps))
        gens = [_trajectory(f"lat-{i}", steps, rng) for i in range(n_traj)]
        events = [e for group in zip(*[list(g) for g in gens], strict=True) for e in group]
        prod = _producer(bootstrap, linger_ms=1)
        interval = 1.0 / rate
        start = time.monotonic()
        sent_steps = 0
        for event in events:
            if event.type == "step.recorded":
                target = start + sent_steps * interval
                delay = target - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                sent_steps += 1
            prod.send("agent.events", key=encode_key(event), value=encode(event))
        prod.flush(timeout=60)
        prod.close()
        deadline = time.monotonic() + 120
        while _count(consumer, "reward.rule") - base < sent_steps and time.monotonic() < deadline:
            time.sleep(0.2)
        consumer.close()
        return _join_latencies(bootstrap)
    finally:
        _stop(proc)


def _read_all(bootstrap: str, topic: str) -> list[Record]:
    """Every record of `topic` up to its end offsets now; a read that does not get there in 120 s
    raises (`ReadIncomplete`) rather than measure latencies on part of the records."""
    from clients.kafka import make_consumer
    from clients.kafka.ranges import iter_range, topic_partitions

    consumer = make_consumer(bootstrap, CLIENT_ID)
    try:
        return list(iter_range(consumer, topic_partitions(consumer, [topic]), timeout_s=120, strict=True))
    finally:
        consumer.close()


def _join_latencies(bootstrap: str) -> list[float]:
    import orjson

    sent = {}
    for rec in _read_all(bootstrap, "agent.events"):
        if rec.key and rec.key.startswith(b"lat-"):
            event = orjson.loads(rec.value)
            if event["type"] == "step.recorded":
                sent[event["event_id"]] = rec.timestamp_ms
    out = []
    for rec in _read_all(bootstrap, "reward.rule"):
        if rec.key and rec.key.startswith(b"lat-"):
            source = orjson.loads(rec.value)["source_event_id"]
            if source in sent:
                out.append(float(rec.timestamp_ms - sent.pop(source)))
    return out


def _measure_baseline(bootstrap: str, scratch: Path, trajectories: int, steps: int) -> float:
    from clients.kafka import ensure_topics
    from schemas.topics import TopicSpec

    ensure_topics(bootstrap, [TopicSpec(BASELINE_TOPIC, ("reward.rule.step",))])
    args = python_module_argv("infra.bench.streams", "baseline", bootstrap, str(scratch / "baseline"))
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(scratch / "baseline.log", "ab"))  # noqa: SIM115
    try:
        # the baseline reads agent.events from the beginning: every step published so far
        return _rate_of(bootstrap, BASELINE_TOPIC, _steps_in_topic(bootstrap), timeout_s=60.0)
    finally:
        _stop(proc)


def _steps_in_topic(bootstrap: str) -> int:
    import orjson

    return sum(
        1
        for rec in _read_all(bootstrap, "agent.events")
        if orjson.loads(rec.value)["type"] == "step.recorded"
    )


# --- the baseline: a plain faust agent, one event at a time -------------------------------------------


def _baseline_app(faust, bootstrap: str, data_dir: str):
    """A plain faust app with in-memory tables, raw keys and values, reading from the start."""
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    return faust.App(
        BASELINE_APP,
        broker=f"kafka://{bootstrap}",
        datadir=data_dir,
        store="memory://",
        web_enabled=False,
        key_serializer="raw",
        value_serializer="raw",
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        topic_partitions=4,
    )


def baseline_main(bootstrap: str, data_dir: str) -> None:
    """Rule rewards the textbook faust way: one event at a time, one `await send` per reward.

    State is a plain dict (lost on restart): with a faust Table updated per event, this agent
    crawled at a few steps/s here (faust's changelog buffer waits 0.1 s per message once full),
    so the comparison is against the stateless form, the faster of the two."""
    import orjson

    from streams.faust_compat import import_faust

    faust = import_faust()  # the same faust code path as our workers

    from schemas.codec import decode, encode
    from schemas.events import EpisodeStarted, StepRecorded
    from streams.rules.profiles import ProfileRegistry
    from streams.rules.stream import TrajectoryRules

    app = _baseline_app(faust, bootstrap, data_dir)
    profiles = ProfileRegistry()
    table: dict[bytes, bytes] = {}  # a faust Table here ran at ~6 steps/s (changelog buffer stalls)
    source = app.topic("agent.events", key_type=bytes, value_type=bytes)
    out = app.topic(BASELINE_TOPIC, key_type=bytes, value_type=bytes)

    @app.agent(source)
    async def rules(stream):
        async for value in stream:
            event = decode(value)
            key = event.trajectory_id.encode()
            raw = table.get(key)
            state = TrajectoryRules.from_dict(orjson.loads(raw)) if raw else TrajectoryRules()
            if isinstance(event, EpisodeStarted):
                state.on_started(event)
            elif isinstance(event, StepRecorded):
                state.on_step(event)
            for reward in state.advance(event.trajectory_id, profiles):
                await out.send(key=key, value=encode(reward))
            table[key] = orjson.dumps(state.to_dict())  # same serialisation cost as the real one

    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "baseline":
        baseline_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: python -m infra.bench.streams baseline BOOTSTRAP DATA_DIR")
