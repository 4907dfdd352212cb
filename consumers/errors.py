"""The `consumers` package's exception root. Every error the sink, the batch builder and the
training executor raise on purpose derives from `ConsumersError`, so the CLI prints it as one line.

    AgentstreamError (schemas.errors)
    └── ConsumersError
        ├── ConsumerConfigError   an option is invalid (the message names the flag and the value)
        ├── TrainerError          the batch builder or the executor cannot go on
        └── SinkError             the ClickHouse sink cannot go on
            └── SinkUnavailable   ClickHouse stayed unreachable past the retry budget
                                  (consumers.sink.clickhouse)

Messages name the option or field and the value received, so a user can fix the input without
reading code.
"""

from __future__ import annotations

from schemas.errors import AgentstreamError


class ConsumersError(AgentstreamError):
    """Root of the errors raised on purpose by the sink, the batch builder and the executor."""


class ConsumerConfigError(ConsumersError):
    """An option of the sink, the batch builder or the executor is invalid."""


class TrainerError(ConsumersError):
    """The batch builder or the training executor cannot go on (bad batch, missing model, ...)."""


class SinkError(ConsumersError):
    """The ClickHouse sink cannot go on."""
