"""Every error the `streams` package raises on purpose, and the one rule for option files.

The tree (each class is also importable from the module that raises it)::

    AgentstreamError                 schemas.errors: the project root; the CLI prints it as one line
    └── StreamsError                 root of the streams package
        ├── WorkerConfigError        streams.config: a worker option is invalid
        ├── BatchFailed              the shell: a batch's outputs were not acknowledged or its
        │                            input has an offset gap; the role exits without committing
        ├── OutputTooLarge           the shell: a record's output or state would not fit in one
        │                            message; the record is poison (dead-lettered), nothing sent
        ├── FaustVersionError        streams.faust_compat: the installed faust is not the series
        │                            the shell was written for
        ├── ProfileError             streams.rules.profiles: a profiles file or mapping is invalid
        ├── JudgeRulesError          streams.judge.selection: a judge rules file is invalid
        ├── RubricsError             streams.judge.rubrics: a rubrics file is invalid, or a rule
        │                            names a rubric its domain does not have
        ├── ParseError               streams.judge.parse: a model reply holds no readable JSON
        ├── JudgeCallError           streams.judge.client: a judge call failed for good
        ├── JudgeConfigError         streams.judge.config: a judge setting in the environment is invalid
        ├── JudgePriceError          streams.judge.pricing: a budget is set but a judge model has no price
        ├── JudgeLedgerError         streams.judge.ledger: the shared budget/cache topic could not be
        │                            written or read back in time
        ├── CalibrationError         streams.judge.calibration: scores that cannot be calibrated
        └── AnnotationError          streams.judge.annotations: a human label is invalid

Option files (profiles, judge rules, rubrics) follow one rule, `option_file`: no path given means
the built-in defaults; a path given that is not a file is an error naming the path, never a silent
fall-back to the defaults.

This module imports nothing from streams, so every module can import it.
"""

from __future__ import annotations

from pathlib import Path

from schemas.errors import AgentstreamError


class StreamsError(AgentstreamError):
    """Root of every error the streams package raises on purpose."""


class WorkerConfigError(StreamsError):
    """A worker option is invalid."""


class BatchFailed(StreamsError):
    """A batch's outputs were not acknowledged or its input has an offset gap; the role exits
    without committing."""


class OutputTooLarge(StreamsError):
    """An output event or a state value over what one Kafka message may hold (`MAX_EVENT_BYTES`):
    sending it would fail at every replay, so the record that made it is poison."""


class FaustVersionError(StreamsError):
    """The installed faust-streaming is not the series streams/faust_compat.py was written for."""


class ProfileError(StreamsError):
    """A profile file or mapping is invalid (the message names the field and the value)."""


class JudgeRulesError(StreamsError):
    """A judge rules file that cannot be read or does not validate."""


class RubricsError(StreamsError):
    """A rubric file that cannot be read or does not validate."""


class ParseError(StreamsError):
    """The model's reply could not be read as the expected JSON."""


class JudgeCallError(StreamsError):
    """A judge call that failed for good (retries exhausted, not retryable, or circuit open)."""

    def __init__(self, reason: str, *, kind: str = "error", attempts: int = 0, status: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.attempts = attempts
        self.status = status


class CalibrationError(StreamsError):
    """Inputs that cannot be calibrated (too few pairs, mismatched lengths)."""


class AnnotationError(StreamsError):
    """A label that is not valid (names the field and the value)."""


def option_file(path: str | Path | None, what: str, error: type[StreamsError]) -> Path | None:
    """The file an option names, or None when the option was not given (None or empty).

    A path that was given but is not an existing file raises `error` naming it. An empty
    environment variable read as a `Path` arrives as `.`, so `.` counts as not given too: a
    directory can never be one of these files.

    >>> option_file(None, "judge rules file", StreamsError) is None
    True
    >>> option_file("/no/such/rules.yaml", "judge rules file", StreamsError)
    Traceback (most recent call last):
    ...
    streams.errors.StreamsError: judge rules file /no/such/rules.yaml does not exist
    """
    if path is None or str(path).strip() in ("", "."):
        return None
    path = Path(path)
    if not path.exists():
        raise error(f"{what} {path} does not exist")
    if not path.is_file():
        raise error(f"{what} {path} is not a file")
    return path
