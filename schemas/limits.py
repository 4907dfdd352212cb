"""Bounds in the contract: the largest value of every field that sizes work, in one place.

Why: a field that sizes work (a step index, a step count, how deeply a value nests, how long a string
or an event is) is a lever a hostile or careless producer can pull. Each bound here is enforced at
every entry point (SDK, gateway, OTLP, `ingest`, policy server) by the event models, and respected by
every consumer, so that no stage does work or holds state in proportion to what a field *claims*.
The gateway's OpenAPI document, the JSON Schema export and the ClickHouse columns say the same.

Every bound sits under what the broker and the dead-letter path accept: an event at its largest,
wrapped in a dead letter, still fits in one Kafka message (`MAX_DEAD_LETTER_PAYLOAD_BYTES`).
"""

from __future__ import annotations

# Steps in one episode: `step_index` is below it, `total_steps` and `reference_steps` at most it.
# The store keeps step indexes in UInt32; agents that run past 100,000 steps in one episode should
# start a new one.
MAX_STEPS = 100_000
MAX_STEP_INDEX = MAX_STEPS - 1

# How deeply an event's JSON may nest (objects and arrays, counting the event itself as level 1).
# orjson refuses past 254; every stage must be able to decode, copy and re-encode what it accepts.
MAX_JSON_DEPTH = 64

# One event, encoded as compact JSON. Apache Kafka's default message.max.bytes is 1,048,588 for a
# whole record batch, so an event must leave room for the batch and record headers and its key.
MAX_EVENT_BYTES = 1_000_000

# One string field (a thought, an observation, a task), in characters. An event bounds its strings
# together; this bounds one, so a single field cannot take the whole event.
MAX_STRING_CHARS = 512_000

# Identifiers (event ids, trajectory ids, task ids, producers, tools, models), in characters.
MAX_ID_CHARS = 256

# A dead letter carries at most this much of the input it refuses (a prefix, with the size and a
# hash of the whole), so a dead letter of the largest refusable input still fits in one message.
MAX_DEAD_LETTER_PAYLOAD_BYTES = 64_000

# Token id lists on a step (completion, prompt delta, each sample), in tokens.
MAX_TOKENS_PER_LIST = 131_072

LIMITS: dict[str, int] = {
    "max_steps": MAX_STEPS,
    "max_step_index": MAX_STEP_INDEX,
    "max_json_depth": MAX_JSON_DEPTH,
    "max_event_bytes": MAX_EVENT_BYTES,
    "max_string_chars": MAX_STRING_CHARS,
    "max_id_chars": MAX_ID_CHARS,
    "max_dead_letter_payload_bytes": MAX_DEAD_LETTER_PAYLOAD_BYTES,
    "max_tokens_per_list": MAX_TOKENS_PER_LIST,
}


def json_depth(value: object, limit: int = MAX_JSON_DEPTH) -> int:
    """How deeply `value` nests (a scalar is 0, `{}` and `[]` are 1), counting no further than
    `limit + 1`, so a hostile value costs at most its size and never a recursion error.

    >>> json_depth({"a": [1, {"b": 2}]})
    3
    >>> json_depth([[[[]]]], limit=2)
    3
    """
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        stack.extend((child, depth) for child in children)
    return deepest
