"""The contract's bounds (`schemas.limits`) as pydantic field types, for the event models.

Most are constraints pydantic checks in its Rust core (`le=`, `max_length=`), so the hot path - every
stage decodes every event - pays almost nothing for them; free-form JSON gets one walk without
recursion. A violation is a validation error naming the field, the value and the limit.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field

from schemas.limits import (
    MAX_ID_CHARS,
    MAX_JSON_DEPTH,
    MAX_STEP_INDEX,
    MAX_STEPS,
    MAX_STRING_CHARS,
    MAX_TOKENS_PER_LIST,
)

# The widths of the store's integer columns (ClickHouse UInt32, Int64). ClickHouse converts an integer
# that does not fit without a word (2**40 tokens were stored as 0, an exit code of 2**63 as -2**63),
# so the contract refuses what its column cannot hold. Not a policy number: the storage type's.
UINT32_MAX = 2**32 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Score = Annotated[float, Field(ge=0.0, le=1.0)]
NonNegFloat = Annotated[float, Field(ge=0.0)]
StepIndex = Annotated[int, Field(ge=0, le=MAX_STEP_INDEX)]
StepCount = Annotated[int, Field(ge=0, le=MAX_STEPS)]
Count = Annotated[int, Field(ge=0, le=UINT32_MAX)]  # tokens, redactions, rows: a UInt32 column
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]  # e.g. an exit code: an Int64 column
# A size in bytes (a UInt64 column), unbounded above: a dead letter must never fail to be made.
ByteCount = Annotated[int, Field(ge=0)]
Id = Annotated[str, Field(max_length=MAX_ID_CHARS)]
Text = Annotated[str, Field(max_length=MAX_STRING_CHARS)]
# Token ids are 0..UINT32_MAX; checked where events enter (`schemas.codec.validate(strict=True)`), not
# here: a per-element constraint made a 4,096-token step 40% slower to decode, at every hop.
# The documents (JSON Schema, OpenAPI) still say so, so that a client generated from them agrees.
TOKEN_ID_SCHEMA = {"type": "integer", "minimum": 0, "maximum": UINT32_MAX}
TokenIds = Annotated[
    list[int], Field(max_length=MAX_TOKENS_PER_LIST, json_schema_extra={"items": TOKEN_ID_SCHEMA})
]
Logprobs = Annotated[list[float], Field(max_length=MAX_TOKENS_PER_LIST)]


def _bounded_json(value: Any, levels_above: int = 1) -> Any:
    """Free-form JSON (params, metadata, sampling, ...) nests at most `MAX_JSON_DEPTH` levels counting
    the event around it (`levels_above`: the event's own level, and a list's), and holds only JSON
    numbers: pydantic's own JSON parser reads NaN and Infinity, typed floats refuse them
    (`allow_inf_nan=False`) and this refuses them inside free-form values. The walk stops at the
    limit, so it recurses at most `MAX_JSON_DEPTH` levels whatever the input (never a RecursionError),
    and a hostile value costs at most its size."""
    _walk(value, MAX_JSON_DEPTH - levels_above - 1, levels_above + 1)
    return value


def _walk(container: dict | list, levels_left: int, level: int) -> None:
    """Check the children of `container` (at `level`); `levels_left`: how many more may nest."""
    for item in container.values() if isinstance(container, dict) else container:
        kind = type(item)
        if kind is float:
            if item != item or item in (_INF, -_INF):
                raise ValueError(f"{item!r} is not a JSON number (NaN and Infinity are not JSON)")
        elif kind is dict or kind is list or isinstance(item, dict | list | tuple):
            if levels_left <= 0:
                raise ValueError(
                    f"nests at least {level + 1} levels deep counting the event, over the limit of "
                    f"{MAX_JSON_DEPTH} (MAX_JSON_DEPTH)"
                )
            _walk(item, levels_left - 1, level + 1)


def _bounded_json_item(value: Any) -> Any:
    """`_bounded_json` for an item of a list field: the list is one more level above it."""
    return _bounded_json(value, levels_above=2)


_INF = float("inf")
JsonDict = Annotated[dict[str, Any], AfterValidator(_bounded_json)]
# an object inside a list field (a batch.rows chunk's rows): free-form, bounded like JsonDict
JsonObjectItem = Annotated[dict[str, Any], AfterValidator(_bounded_json_item)]
# an item of `samples`: free-form, but its token ids are checked as the step's own are
JsonItem = Annotated[
    dict[str, Any],
    AfterValidator(_bounded_json_item),
    Field(json_schema_extra={"properties": {"token_ids": {"items": {"minimum": 0, "maximum": UINT32_MAX}}}}),
]
