"""`agentstream bench NAME`: each benchmark is a module `infra.bench.NAME` with
`add_arguments(parser)` and `run(args) -> dict` (keys: `rows` for the table, anything else for JSON).

Benchmark modules import their heavy dependencies inside `run`, because `add_arguments` is called
whenever the parser is built (including for `agentstream --help`).
"""

from __future__ import annotations

from importlib import import_module

from infra.cli.options import add_option, command_parser, group_parser

# name -> one-line description; the module infra.bench.<name> implements it.
BENCHMARKS = {
    "codec": "event codec encode/decode throughput (step.recorded, 2 KB observation)",
    "broker": "embedded broker produce/consume throughput with kafka-python and aiokafka; recovery time",
    "produce": "SDK steps/s and gateway events/s with p50/p99 time to broker acknowledgement",
    "streams": "rule-reward and assembly steps/s per worker; publish-to-reward latency",
    "judge": "LLM-judge steps/s at several concurrencies against a local Messages API server",
    "sink": "topic-to-ClickHouse rows/s and publish-to-visible latency",
    "trainer": "batch building trajectories/s and training tokens/s",
    "e2e": "sustained load through every stage; end-to-end latencies",
    "policy": "policy server tokens/s and requests/s per concurrency; recording overhead; reload pauses",
    "rollout": "rollout episodes/s and steps/s on calc per concurrency; local sandbox tool-call overhead",
}


def register(sub) -> None:
    bench = group_parser(sub, "bench", "run a benchmark; prints a table and writes JSON")
    for name, description in BENCHMARKS.items():
        parser = command_parser(bench, name, run_benchmark, description)
        add_option(parser, "--output", help="JSON output path (default: bench-results/<name>.json)")
        add_option(parser, "--repeats", type=int, default=5, help="repeats; figures are medians")
        parser.set_defaults(_bench=name)
        import_module(f"infra.bench.{name}").add_arguments(parser)


def run_benchmark(args) -> int:
    from infra.bench.report import write_report

    result = import_module(f"infra.bench.{args._bench}").run(args)
    write_report(args._bench, result, args.output)
    return 0
