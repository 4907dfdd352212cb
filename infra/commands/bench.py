"""`agentstream bench NAME`: each benchmark is a module of `infra.bench` (of a folder there,
its `benchmark` module), listed in BENCHMARKS, with `add_arguments(parser)` and `run(args) -> dict`
(keys: `rows` for the table, anything else for JSON).

Benchmark modules import their heavy dependencies inside `run`, because `add_arguments` is called
whenever the parser is built (including for `agentstream --help`).
"""

from __future__ import annotations

from infra.bench import (
    broker,
    codec,
    e2e,
    judge,
    learn,
    otlp,
    produce,
    redaction,
    rollout,
    sink,
    streams,
    trainer,
)
from infra.bench.console import benchmark as console
from infra.bench.policy import benchmark as policy
from infra.options.env import add_option, command_parser, group_parser, positive_int

# name -> (the module that implements it, one-line description)
BENCHMARKS = {
    "codec": (codec, "event codec encode/decode throughput (step.recorded, 2 KB observation)"),
    "broker": (
        broker,
        "embedded broker produce/consume throughput with kafka-python and aiokafka; recovery time",
    ),
    "produce": (produce, "SDK steps/s and gateway events/s with p50/p99 time to broker acknowledgement"),
    "streams": (streams, "rule-reward and assembly steps/s per worker; publish-to-reward latency"),
    "judge": (judge, "LLM-judge steps/s at several concurrencies against a local Messages API server"),
    "sink": (sink, "topic-to-ClickHouse rows/s and publish-to-visible latency"),
    "trainer": (trainer, "batch building trajectories/s and training tokens/s"),
    "e2e": (e2e, "sustained load through every stage; end-to-end latencies"),
    "policy": (
        policy,
        "policy server tokens/s and requests/s per concurrency; recording overhead; reload pauses",
    ),
    "rollout": (
        rollout,
        "calc rollouts/s per concurrency; sandbox tool-call cost (local, Docker), coding episodes/s, "
        "engine set-up",
    ),
    "console": (
        console,
        "web console server time per page: trajectory list, filtered, page 200, a 200-step trajectory",
    ),
    "otlp": (
        otlp,
        "gateway OTLP/HTTP spans/s into agent.events (protobuf, 100 spans a request), p50/p99 a request",
    ),
    "learn": (learn, "the learning loop per seed and a control: held-out gain with a 95% interval"),
    "redaction": (
        redaction,
        "redaction CPU us per 2 KB step (clean, with @/URLs, with 4 secrets) beside encoding",
    ),
}
# The files `bench readme` reads and rewrites: option -> (default path, help).
README_FILES = {
    "--e2e": ("docs/bench/e2e.json", "`bench e2e` JSON to read"),
    "--produce": ("docs/bench/produce.json", "`bench produce` JSON (SDK CPU), if any"),
    "--baseline": (
        "docs/bench/e2e-before.json",
        "an earlier `bench e2e` JSON whose figures are shown beside the targets, if any",
    ),
    "--readme": ("README.md", "file with the <!-- bench:e2e-summary --> markers"),
    "--benchmarks": ("docs/benchmarks.md", "file with the <!-- bench:e2e --> markers (the full table)"),
}


def register(sub) -> None:
    bench = group_parser(sub, "bench", "run a benchmark; prints a table and writes JSON")
    for name, (module, description) in BENCHMARKS.items():
        parser = command_parser(bench, name, run_benchmark, description)
        add_option(parser, "--output", help="JSON output path (default: bench-results/<name>.json)")
        add_option(parser, "--repeats", type=positive_int, default=5, help="repeats; figures are medians")
        parser.set_defaults(_bench=name)
        module.add_arguments(parser)
    readme = command_parser(
        bench,
        "readme",
        regenerate_readme,
        "regenerate the README's performance table from bench JSON",
        common=False,
    )
    for flag, (path, text) in README_FILES.items():
        add_option(readme, flag, default=path, help=text)


def run_benchmark(args) -> int:
    from infra.bench.report import write_report

    result = BENCHMARKS[args._bench][0].run(args)
    write_report(args._bench, result, args.output)
    return 0


def regenerate_readme(args) -> int:
    import json
    from pathlib import Path

    from infra.bench.readme import ReadmeError, regenerate
    from infra.terminal.output import say

    if not Path(args.e2e).exists():
        raise ReadmeError(f"--e2e: {args.e2e} does not exist (run `agentstream bench e2e --output ...`)")
    e2e = json.loads(Path(args.e2e).read_text())
    produce, baseline = (
        json.loads(Path(path).read_text()) if Path(path).exists() else None
        for path in (args.produce, args.baseline)
    )
    for path in dict.fromkeys((Path(args.readme), Path(args.benchmarks))):
        path.write_text(regenerate(path.read_text(), e2e, produce, baseline))
        say(f"{path}: performance table regenerated from {args.e2e}")
    return 0
