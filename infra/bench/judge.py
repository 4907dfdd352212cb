"""`agentstream bench judge`: judged steps/s per worker against a Messages-API server with a fixed
latency, and the judge processor's own overhead per call.

Setup: the bench's fixed-latency Messages-API endpoint (`infra/bench/judge_endpoint.py`) runs in its
own process and answers every call after `--latency` seconds (default 0.5) with a well-formed reply.
The real judge processor (`streams.judge.processor.JudgeProcessor`, real anthropic SDK, cache off so
every step costs a call) judges `--calls-per-slot` x concurrency distinct steps at each concurrency
level. The ideal is concurrency / latency calls per second; efficiency is measured / ideal.

Overhead rows: the processor around a call with the HTTP call replaced by an instant canned reply
(prompt, cache key, budget, parse, events), and the SDK + local HTTP round trip with 0 latency.
Figures are medians over `--repeats`.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from datetime import UTC, datetime

from infra.bench import report
from infra.bench.judge_endpoint import fixed_reply
from infra.runtime import python_module_argv, stop_child

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCORE = 0.5  # the endpoint's default score


def add_arguments(parser) -> None:
    parser.add_argument("--latency", type=float, default=0.5, help="server answer delay, seconds")
    parser.add_argument("--concurrency", default="8,32,128", help="comma-separated levels")
    parser.add_argument("--calls-per-slot", type=int, default=4, help="calls per concurrency slot per level")
    parser.add_argument("--batch-steps", type=int, default=1, help="steps per call (judge rule batch_steps)")
    parser.add_argument("--overhead-calls", type=int, default=300, help="calls for the overhead rows")


def run(args) -> dict:
    levels = [int(x) for x in str(args.concurrency).split(",") if x.strip()]
    import anthropic  # noqa: F401 - import once up front so the first level does not pay for it

    rows = []
    with _server(args.latency) as url:
        for level in levels:
            rows.append(_throughput_row(url, level, args))
        if args.batch_steps == 1:
            rows.append(_throughput_row(url, levels[len(levels) // 2], args, batch_steps=4))
    rows += _overhead_rows(args)
    notes = [
        f"server latency {args.latency * 1000:.0f} ms per call; ideal calls/s = concurrency / latency",
        "steps/s counts judged steps (reward.judge.step events); batch_steps > 1: several steps per call",
        "overhead rows: us per call (median); 'no HTTP' = canned instant reply, '0 ms' = SDK + local HTTP",
    ]
    return {"rows": rows, "notes": notes}


class _server:
    """The fixed-latency endpoint in a child process (its own GIL), stopped by PID."""

    def __init__(self, latency: float):
        self.latency = latency

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(
            python_module_argv("infra.bench.judge_endpoint", "--latency", str(self.latency)),
            stdout=subprocess.PIPE,
            text=True,
        )
        return self.proc.stdout.readline().strip()

    def __exit__(self, *exc) -> None:
        stop_child(self.proc)


def _processor(url: str | None, concurrency: int, batch_steps: int, client=None):
    from streams.judge.client import JudgeClient
    from streams.judge.config import JudgeConfig
    from streams.judge.processor import JudgeProcessor
    from streams.judge.rubrics import RubricCatalog
    from streams.judge.selection import JudgeRule, JudgeRules

    config = JudgeConfig(
        api_key="bench", base_url=url or "http://127.0.0.1:9", concurrency=concurrency, cache_entries=0
    )
    rules = JudgeRules(rules=[JudgeRule(mode="step", batch_steps=batch_steps)])
    return JudgeProcessor(config, rules, RubricCatalog(), client or JudgeClient(config), now=lambda: T0)


def _events(run_id: str, calls: int, batch_steps: int) -> list:
    from schemas.events import EpisodeEnded, EpisodeStarted, StepRecorded

    events = []
    for n in range(calls):
        tid = f"bench-{run_id}-{n}"
        events.append(
            EpisodeStarted(event_id=f"{tid}-s", trajectory_id=tid, occurred_at=T0, producer="bench",
                           task_id="k", task=f"task {tid}: make the tests pass", domain="coding")
        )  # fmt: skip
        for i in range(batch_steps):
            events.append(
                StepRecorded(event_id=f"{tid}-{i}", trajectory_id=tid, occurred_at=T0, producer="bench",
                             step_index=i, tool="bash", params={"cmd": f"pytest -x tests/{n}"},
                             observation="collected 12 items\n" + "." * 400 + "\n12 passed", exit_code=0)
            )  # fmt: skip
        events.append(EpisodeEnded(event_id=f"{tid}-e", trajectory_id=tid, occurred_at=T0, producer="bench",
                                   success=True))  # fmt: skip
    return events


def _throughput_row(url: str, concurrency: int, args, batch_steps: int | None = None) -> dict:
    batch_steps = batch_steps or args.batch_steps
    calls = concurrency * args.calls_per_slot
    rates, seconds = [], []
    for repeat in range(max(1, args.repeats)):
        events = _events(f"c{concurrency}-b{batch_steps}-r{repeat}-{time.time_ns()}", calls, batch_steps)
        elapsed, scored = asyncio.run(_timed(_processor(url, concurrency, batch_steps), events))
        if scored != calls * batch_steps:
            raise RuntimeError(f"expected {calls * batch_steps} judged steps, got {scored}")
        rates.append(scored / elapsed)
        seconds.append(elapsed)
    ideal = concurrency / args.latency * batch_steps
    rate = report.median(rates)
    return {
        "case": "throughput",
        "concurrency": concurrency,
        "batch_steps": batch_steps,
        "calls": calls,
        "seconds": report.median(seconds),
        "steps_per_s": rate,
        "ideal_steps_per_s": ideal,
        "efficiency": rate / ideal,
        "us_per_call": None,
    }


async def _timed(processor, events) -> tuple[float, int]:
    try:
        started = time.perf_counter()
        result = await processor.process_events(events)
        elapsed = time.perf_counter() - started
    finally:
        await processor.client.close()
    return elapsed, sum(1 for e in result.outputs if e.type == "reward.judge.step")


class _InstantClient:
    """Stands in for the HTTP call: answers at once what the endpoint would."""

    async def complete(self, prompt):
        from streams.judge.client import CallResult

        text = fixed_reply(prompt.user, SCORE)
        return CallResult(text, "claude-sonnet-4-6", len(prompt.user) // 4, len(text) // 4, 0.0, 1)

    async def close(self):
        return None


def _overhead_rows(args) -> list[dict]:
    n = args.overhead_calls
    processor_us, full_us = [], []
    for repeat in range(max(1, args.repeats)):
        events = _events(f"oh-{repeat}-{time.time_ns()}", n, 1)
        elapsed, _ = asyncio.run(_timed(_processor(None, 1, 1, client=_InstantClient()), events))
        processor_us.append(elapsed / n * 1e6)
    with _server(0.0) as url:
        for repeat in range(max(1, args.repeats)):
            events = _events(f"full-{repeat}-{time.time_ns()}", n, 1)
            elapsed, _ = asyncio.run(_timed(_processor(url, 1, 1), events))
            full_us.append(elapsed / n * 1e6)

    def row(case: str, values: list[float]) -> dict:
        return {
            "case": case,
            "concurrency": 1,
            "batch_steps": 1,
            "calls": n,
            "seconds": None,
            "steps_per_s": None,
            "ideal_steps_per_s": None,
            "efficiency": None,
            "us_per_call": report.median(values),
        }

    return [
        row("overhead: processor, no HTTP", processor_us),
        row("overhead: processor+SDK+HTTP, 0 ms", full_us),
    ]
