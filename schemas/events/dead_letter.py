"""`agentstream.dlq`: input a stage could not use (built by `schemas.deadletter`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.bounded import ByteCount, Id, Text
from schemas.events.envelope import EventBase


class DeadLetter(EventBase):
    """Input a stage could not use, with why and where it came from. `trajectory_id` is 'unknown'
    when the input did not carry one."""

    type: Literal["dead.letter"] = "dead.letter"
    reason: Text
    error_type: Id = ""
    stage: str = Field(description="the processor that rejected it (its stable name)")
    source_topic: str | None = None
    source_partition: int | None = None
    source_offset: int | None = None
    source_key: Id | None = None
    payload: Text = Field(
        "",
        description="the rejected bytes, or their first MAX_DEAD_LETTER_PAYLOAD_BYTES when larger (see "
        "payload_truncated): utf-8 text, or base64 (see encoding)",
    )
    payload_encoding: Literal["utf-8", "base64"] = "utf-8"
    payload_bytes: ByteCount | None = Field(None, description="size of the whole rejected input (since 1.3)")
    payload_sha256: str | None = Field(
        None, max_length=64, description="sha256 hex of the whole rejected input (since 1.3)"
    )
    payload_truncated: bool = Field(False, description="`payload` is a prefix of the input (since 1.3)")
