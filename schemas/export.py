"""JSON Schema export: one file per event type, for users in other languages and for validation."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.events import EVENT_MODELS, SCHEMA_VERSION


def json_schema(event_type: str) -> dict:
    """The JSON Schema (draft 2020-12) of one event type, as producers must write it."""
    model = EVENT_MODELS[event_type]
    schema = model.model_json_schema(mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://agentstream.dev/schemas/{SCHEMA_VERSION}/{event_type}.json"
    schema["properties"]["type"]["const"] = event_type
    required = set(schema.get("required", []))
    schema["required"] = sorted(required | {"type", "event_id", "trajectory_id", "occurred_at", "producer"})
    return schema


def export_schemas(directory: Path) -> list[Path]:
    """Write `<type>.json` for every event type into `directory`; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for event_type in EVENT_MODELS:
        path = directory / f"{event_type}.json"
        path.write_text(json.dumps(json_schema(event_type), indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
