"""`agentstream bench codec`: encode/decode throughput for `step.recorded` with a 2 KB observation."""

from __future__ import annotations

import time


def add_arguments(parser) -> None:
    parser.add_argument("--events", type=int, default=20_000, help="events per repeat")
    parser.add_argument("--observation-bytes", type=int, default=2048, help="observation size")


def _sample(n: int, observation_bytes: int):
    from schemas import StepRecorded, utc_now

    observation = ("x" * 63 + "\n") * (observation_bytes // 64) + "y" * (observation_bytes % 64)
    return [
        StepRecorded(
            event_id=f"e{i}",
            trajectory_id=f"t{i % 97}",
            occurred_at=utc_now(),
            producer="bench",
            step_index=i % 50,
            thought="run the failing test to see the traceback",
            tool="bash",
            params={"command": "pytest -x tests/test_io.py", "timeout": 60},
            observation=observation,
            exit_code=1,
            model="sim-large",
            input_tokens=812,
            output_tokens=64,
            latency_ms=830.5,
        )
        for i in range(n)
    ]


def run(args) -> dict:
    from infra.bench.report import median
    from schemas import decode, encode

    events = _sample(args.events, args.observation_bytes)
    encode_rates, decode_rates = [], []
    payload = [encode(e) for e in events]
    for _ in range(max(1, args.repeats)):
        start = time.perf_counter()
        payload = [encode(e) for e in events]
        encode_rates.append(len(events) / (time.perf_counter() - start))
        start = time.perf_counter()
        for blob in payload:
            decode(blob)
        decode_rates.append(len(events) / (time.perf_counter() - start))
    size = sum(map(len, payload)) / len(payload)
    rows = [
        {
            "operation": "encode",
            "events/s (median)": median(encode_rates),
            "MB/s": median(encode_rates) * size / 1e6,
        },
        {
            "operation": "decode",
            "events/s (median)": median(decode_rates),
            "MB/s": median(decode_rates) * size / 1e6,
        },
    ]
    return {
        "rows": rows,
        "event_bytes": size,
        "events_per_repeat": args.events,
        "repeats": args.repeats,
        "encode_events_per_s": encode_rates,
        "decode_events_per_s": decode_rates,
    }
