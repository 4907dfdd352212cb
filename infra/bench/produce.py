"""`agentstream bench produce`: SDK steps/s and gateway events/s, each with p50/p99 time to broker
acknowledgement.

- SDK: one process records `--steps` steps (2 KB observations, episodes of 100 steps) with
  `AgentRecorder`; throughput = steps / (first `step()` .. `flush()` returned); per-event latency =
  `step()` returned .. the delivery thread saw the broker's acknowledgement (it passes the spool's
  fsync on the way: every event is written ahead); CPU per step = the process's own CPU time (all
  its threads: the caller's, the spool writer's and the delivery's) over the same span, after a
  warm-up episode has connected.
- Gateway: an `agentstream gateway` process per Kafka client (aiokafka, and kafka-python in an
  executor) loaded by an aiohttp client with `--concurrency` requests in flight, `--requests`
  requests of `--events-per-request` steps; latency = request sent .. 202 (which the gateway
  answers only after the broker acknowledged every event of the request).

Starts its own embedded broker (`agentstream broker`) in a temporary directory and stops it by PID.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from infra.bench.children import AGENTSTREAM, Child, scratch_broker

OBSERVATION = "o" * 2048


def add_arguments(parser) -> None:
    from infra.options.env import add_option

    add_option(parser, "--steps", type=int, default=5000, help="SDK steps per repeat")
    add_option(parser, "--requests", type=int, default=200, help="gateway requests per repeat and client")
    add_option(parser, "--events-per-request", type=int, default=50, help="steps per gateway request")
    add_option(parser, "--concurrency", type=int, default=8, help="gateway requests in flight")


def start_gateway(directory: Path, bootstrap: str, client: str, key_hash: str) -> Child:
    ready = directory / f"gateway-{client}.ready"
    args = [*AGENTSTREAM, "gateway", "--bootstrap-servers", bootstrap, "--port", "0", "--client", client]
    args += [
        "--api-key-hashes",
        key_hash,
        "--max-body-bytes",
        str(64 * 1024 * 1024),
        "--ready-file",
        str(ready),
    ]
    return Child(args, directory / f"gateway-{client}.log", ready)


# --- SDK -------------------------------------------------------------------------------------------


def sdk_once(bootstrap: str, data_dir: Path, steps: int, rate: float | None = None) -> dict:
    """Record `steps` steps as fast as possible, or paced at `rate` steps/s, under CPython's default
    garbage-collector thresholds: those of an agent's process, not of this `agentstream` one."""
    from infra.runtime import default_gc

    with default_gc():
        return _sdk_once(bootstrap, data_dir, steps, rate)


def _sdk_once(bootstrap: str, data_dir: Path, steps: int, rate: float | None) -> dict:
    from producers.sdk.recorder import AgentRecorder

    sent: dict[str, float] = {}
    latencies: list[float] = []

    def on_delivered(records) -> None:
        now = time.perf_counter()
        latencies.extend(now - sent[r.event_id] for r in records if r.event_id in sent)

    rec = AgentRecorder(bootstrap, data_dir, agent="bench", model="m", on_delivered=on_delivered)
    with rec.episode(task_id="bench-warm-up") as ep:  # connect before the clock starts: the first
        ep.end(success=True)  # delivery opens the producer and reads the topic's end offsets
    if not rec.flush(30):
        raise RuntimeError("SDK benchmark: the warm-up episode was not acknowledged in 30 s")
    start, start_cpu = time.perf_counter(), time.process_time()
    done = 0
    while done < steps:
        with rec.episode(task_id="bench") as ep:
            for _ in range(min(100, steps - done)):
                if rate is not None:
                    _pace(start + done / rate)
                event = ep.step(tool="bash", params={"cmd": "ls"}, observation=OBSERVATION, exit_code=0)
                sent[event.event_id] = time.perf_counter()
                done += 1
            ep.end(success=True)
    accepted_s = time.perf_counter() - start
    if not rec.flush(120):
        raise RuntimeError(f"SDK benchmark: {rec.pending} events undelivered after 120 s")
    elapsed = time.perf_counter() - start
    cpu_s = time.process_time() - start_cpu  # this process's CPU, every thread: the SDK's whole cost
    rec.close()
    return {
        "rate": steps / elapsed,
        "accept_rate": steps / accepted_s,
        "latencies": latencies,
        "cpu_us_per_step": cpu_s / steps * 1e6,
    }


def _pace(until: float) -> None:
    pause = until - time.perf_counter()
    if pause > 0:
        time.sleep(pause)


# --- gateway ---------------------------------------------------------------------------------------


def gateway_batch(n: int) -> bytes:
    import orjson

    from schemas.events import StepRecorded, utc_now

    trajectory_id = str(uuid.uuid4())
    events = [
        StepRecorded(
            event_id=str(uuid.uuid4()), trajectory_id=trajectory_id, occurred_at=utc_now(), producer="bench",
            step_index=i, tool="bash", observation=OBSERVATION,
        ).model_dump(mode="json")
        for i in range(n)
    ]  # fmt: skip
    return orjson.dumps(events)


async def post_all(url: str, bodies: list[bytes], headers: dict, ok_status: int, concurrency: int) -> dict:
    """POST every body with `concurrency` in flight; `elapsed_s` (wall time) and each request's latency.
    A warm-up is the caller's (one request before this)."""
    import asyncio

    import aiohttp

    latencies: list[float] = []
    queue: asyncio.Queue = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)

    async def worker(session) -> None:
        while not queue.empty():
            body = queue.get_nowait()
            started = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                answer = await response.read()
                if response.status != ok_status:
                    raise RuntimeError(f"gateway answered {response.status}: {answer[:300]!r}")
            latencies.append(time.perf_counter() - started)

    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return {"elapsed_s": elapsed, "latencies": latencies}


async def gateway_load(url: str, key: str, requests: int, per_request: int, concurrency: int) -> dict:
    import aiohttp

    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=gateway_batch(1), headers=headers) as warmup,
    ):
        await warmup.read()
    bodies = [gateway_batch(per_request) for _ in range(requests)]
    result = await post_all(url, bodies, headers, 202, concurrency)
    return {"rate": requests * per_request / result["elapsed_s"], "latencies": result["latencies"]}


# --- the benchmark ---------------------------------------------------------------------------------


def _row(path: str, client: str, events: int, runs: list[dict], latency: str) -> dict:
    from infra.bench.report import median, percentile

    latencies = [x for run in runs for x in run["latencies"]]
    return {
        "path": path,
        "client": client,
        "events": events,
        "events_per_s": median([r["rate"] for r in runs]),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "cpu_us_per_event": median([r["cpu_us_per_step"] for r in runs if "cpu_us_per_step" in r]),
        "latency": latency,
    }


def run(args) -> dict:
    repeats = max(1, args.repeats)
    with scratch_broker("produce") as (root, broker):
        rows, accept = _sdk_rows(broker.address, root, args.steps, repeats)
        gateway_rows = [
            _gateway_row(broker.address, root, client, args, repeats) for client in GATEWAY_CLIENTS
        ]
        rows += gateway_rows
    ratio = gateway_rows[0]["events_per_s"] / gateway_rows[1]["events_per_s"]
    return {
        "rows": rows,
        "sdk_accept_steps_per_s": accept,
        "gateway_aiokafka_vs_kafka_python": ratio,
        "notes": [
            f"SDK step() accepts {accept:,.0f} steps/s into its buffer; events_per_s above is to broker "
            "acknowledgement (through the fsynced write-ahead spool)",
            f"gateway: aiokafka / kafka-python-in-executor throughput ratio {ratio:.2f} "
            f"({args.events_per_request} events per request, {args.concurrency} in flight; "
            "latency per request)",
            f"medians over {repeats} repeats; 2 KB observations; broker, gateway and load generator "
            "share this machine",
        ],
    }


GATEWAY_CLIENTS = ("aiokafka", "kafka-python")  # the first is measured against the second
SDK_CLIENT = "aiokafka, pre-built batches"  # clients.kafka.record_batches
GATEWAY_KEY = "bench-key"


def _sdk_rows(address: str, root: Path, steps: int, repeats: int) -> tuple[list[dict], float]:
    """The SDK flat out (`repeats` runs), then paced at half that rate; and its accept rate."""
    from infra.bench.report import median

    sdk_runs = [sdk_once(address, root / f"sdk-{i}", steps) for i in range(repeats)]
    rows = [_row("sdk", SDK_CLIENT, steps, sdk_runs, "step() -> broker ack, flat out")]
    accept = median([r["accept_rate"] for r in sdk_runs])
    paced_rate = round(rows[0]["events_per_s"] / 2, -2) or 100.0
    paced = [sdk_once(address, root / "sdk-paced", int(paced_rate * 2), paced_rate)]
    rows.append(_row("sdk paced", SDK_CLIENT, int(paced_rate * 2), paced, f"at {paced_rate:,.0f} steps/s"))
    return rows, accept


def _gateway_row(address: str, root: Path, client: str, args, repeats: int) -> dict:
    """The gateway with `client` as its producer, under `args.concurrency` concurrent requests."""
    import asyncio

    from producers.gateway.requests import hash_key

    gateway = start_gateway(root, address, client, hash_key(GATEWAY_KEY))
    try:
        url = f"http://{gateway.address}/v1/events"
        runs = [
            asyncio.run(
                gateway_load(url, GATEWAY_KEY, args.requests, args.events_per_request, args.concurrency)
            )
            for _ in range(repeats)
        ]
    finally:
        gateway.stop()
    events = args.requests * args.events_per_request
    return _row("gateway", client, events, runs, "request -> 202 (after broker ack)")
