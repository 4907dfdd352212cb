"""`agentstream export`: SFT / DPO / GRPO datasets with task-disjoint splits, and `--validate DIR`
(the work is in `infra.export`; this module only wires options to it and prints the result)."""

from __future__ import annotations

import json

from infra.export.config import ExportConfig
from infra.options.configs import add_config_options, config_from_args
from infra.options.env import add_option, command_parser
from infra.terminal import output


def register(sub) -> None:
    """Add `export` to the `agentstream` parser."""
    parser = command_parser(
        sub,
        "export",
        export_cmd,
        "export SFT / DPO / GRPO datasets (JSONL, Parquet, HF directory) split by task, or --validate one",
    )
    add_config_options(parser, ExportConfig)
    add_option(
        parser,
        "--validate",
        metavar="DIR",
        env="AGENTSTREAM_EXPORT_VALIDATE",
        help="check an export instead: schema, empty messages, leakage between splits, duplicate rows",
    )
    add_option(parser, "--json", action="store_true", default=False, help="print the result as JSON")


def export_cmd(args) -> int:
    if args.validate:
        return _validate(args)
    from infra.export.run import run_export
    from schemas.settings import Settings

    config = config_from_args(ExportConfig, args)
    settings = Settings.from_args(args)
    url = settings.resolved_clickhouse_url if config.source == "clickhouse" else None
    progress = output.warn if not args.json else _quiet
    summary = run_export(config, url, settings.data_dir, progress)
    if args.json:
        output.say(json.dumps(summary, indent=2))
    else:
        splits = ", ".join(
            f"{s} {n} rows / {summary['tasks'][s]} tasks" for s, n in summary["splits"].items()
        )
        output.say(f"exported {summary['rows']} {config.kind} rows to {summary['out_dir']}: {splits}")
    return _report(summary["problems"], "the export", quiet=args.json)


def _validate(args) -> int:
    from infra.export.run import validate_dataset

    report = validate_dataset(args.validate)
    if args.json:
        output.say(json.dumps(report, indent=2))
    else:
        counts = ", ".join(f"{s} {n}" for s, n in report["splits"].items())
        output.say(f"{args.validate}: {report['kind']} rows {counts}")
    return _report(report["problems"], str(args.validate), quiet=args.json)


def _report(problems: list[dict], what: str, quiet: bool) -> int:
    """The problems on stderr, one line each (split, row, reason); exit status 1 if any."""
    if not problems:
        if not quiet:
            output.say("valid: no schema errors, empty messages, leaks or duplicates")
        return 0
    for p in problems:
        output.warn(f"{p['split']} row {p['row']}: {p['reason']}")
    output.error(f"{what}: {len(problems)} problem(s) (listed above)")
    return 1


def _quiet(_line: str) -> None:
    pass
