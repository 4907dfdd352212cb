"""The export's exception (under `infra.errors.InfraError`): a message naming the option, file or
row and the value received; the CLI prints it as one line."""

from __future__ import annotations

from infra.errors import InfraError


class ExportError(InfraError):
    """An export or validation that cannot proceed (bad option, missing source, unreadable file)."""
