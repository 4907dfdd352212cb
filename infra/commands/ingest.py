"""`agentstream ingest`: agent logs on disk -> agent.events (the work is `producers.adapters.ingest`).

Its options are generated from `producers.adapters.ingest.IngestConfig`; `--json` (how the summary
is shown) belongs to the command.
"""

from __future__ import annotations

from infra.options.configs import add_config_options, config_from_args
from infra.options.env import add_option, command_parser
from producers.adapters.ingest import IngestConfig


def register(sub) -> None:
    """Add `ingest` to the `agentstream` parser."""
    parser = command_parser(
        sub,
        "ingest",
        run_ingest,
        "convert agent logs (OpenHands, SWE-agent, mini-swe-agent, OpenAI/Anthropic chats, agentstream "
        "JSONL) into events and publish them to agent.events",
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="log files or directories (searched recursively)"
    )
    add_config_options(parser, IngestConfig)
    add_option(parser, "--json", action="store_true", default=False, help="print the summary as JSON")


def run_ingest(args) -> int:
    import sys
    from dataclasses import replace

    import orjson
    from tqdm import tqdm

    from infra.terminal import output
    from producers.adapters.ingest import format_summary, ingest, succeeded
    from producers.redaction_settings import settings_file
    from schemas.settings import Settings

    found = settings_file(getattr(args, "settings_file", None), Settings.from_args(args).data_dir)
    config = config_from_args(IngestConfig, args, settings_file=str(found) if found else None)
    if not config.dry_run:  # a dry run needs no broker, so no bootstrap setting either
        config = replace(config, bootstrap_servers=Settings.from_args(args).bootstrap_servers)

    def progress(files):
        return tqdm(files, desc="ingest", unit="file", file=sys.stderr, disable=None)

    summary = ingest(args.paths, config, progress)
    output.say(
        orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() if args.json else format_summary(summary)
    )
    return 0 if succeeded(summary) else 1
