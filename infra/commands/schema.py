"""`agentstream schema export DIR`."""

from __future__ import annotations

from infra.options.env import command_parser, group_parser


def register(sub) -> None:
    schema = group_parser(sub, "schema", "event contract: export JSON Schemas")
    export = command_parser(schema, "export", export_command, "write one JSON Schema per event type")
    export.add_argument("directory", help="output directory (created if missing)")


def export_command(args) -> int:
    from pathlib import Path

    from infra.terminal import output
    from schemas.export import export_schemas

    paths = export_schemas(Path(args.directory))
    output.lines(paths)
    output.say(f"wrote {len(paths)} JSON Schemas to {args.directory}")
    return 0
