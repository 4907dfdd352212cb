"""`agentstream ingest`: agent logs on disk -> agent.events (handler in producers/adapters/ingest.py)."""

from __future__ import annotations

from infra.cli.options import add_option, command_parser
from producers.adapters.ingest import main


def register(sub) -> None:
    """Add `ingest` to the `agentstream` parser."""
    parser = command_parser(
        sub,
        "ingest",
        main,
        "convert agent logs (OpenHands, SWE-agent, mini-swe-agent, OpenAI/Anthropic chats, agentstream "
        "JSONL) into events and publish them to agent.events",
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH", help="log files or directories (searched recursively)"
    )
    add_option(
        parser,
        "--format",
        default="auto",
        choices=("auto", "openhands", "swe-agent", "mini-swe-agent", "openai", "anthropic", "jsonl"),
        help="log format (auto: detected per file from its structure)",
    )
    add_option(parser, "--domain", default="", help="domain for every episode (default: per format)")
    add_option(parser, "--agent", default="", help="agent name for every episode (default: from the log)")
    add_option(parser, "--model", default="", help="model name for every episode (default: from the log)")
    add_option(
        parser, "--dry-run", action="store_true", default=False, help="convert and summarise, publish nothing"
    )
    add_option(parser, "--json", action="store_true", default=False, help="print the summary as JSON")
