"""Which adapter reads a file: `--format NAME`, or auto-detection by each adapter's confidence.

Detection looks at the decoded structure (not the file name): every adapter scores the document in
[0, 1] and the highest non-zero score wins; a tie keeps the earlier adapter in `ADAPTERS` (our own
event format first, then the agent formats from the most to the least specific).
"""

from __future__ import annotations

from types import ModuleType

from producers.adapters import (
    agentstream_jsonl,
    anthropic_messages,
    mini_swe_agent,
    openai_chat,
    openhands,
    swe_agent,
)
from producers.adapters.contract import Document
from producers.adapters.fields import shape_of
from producers.errors import AdapterError

ADAPTERS: dict[str, ModuleType] = {
    module.name: module
    for module in (agentstream_jsonl, openhands, swe_agent, mini_swe_agent, openai_chat, anthropic_messages)
}
FORMATS: tuple[str, ...] = ("auto", *ADAPTERS)


def adapter_for(name: str) -> ModuleType:
    """The adapter module called `name` (as `--format` spells it)."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise AdapterError(f"--format: unknown format {name!r} (known: {', '.join(FORMATS)})") from None


def scores(doc: Document) -> dict[str, float]:
    """Every adapter's confidence that `doc` is its format."""
    return {name: float(module.detect(doc)) for name, module in ADAPTERS.items()}


def detect_format(doc: Document) -> str:
    """The best adapter's name for `doc`; AdapterError when no adapter recognises it."""
    ranked = scores(doc)
    best = max(ranked, key=lambda n: ranked[n])  # max keeps the first of equal scores
    if ranked[best] <= 0.0:
        shape = shape_of(doc)
        raise AdapterError(
            f"{doc.path}: unrecognised format: {shape}; none of {', '.join(ADAPTERS)} matched "
            "(give --format to force one and see what is missing)"
        )
    return best
