"""agentstream producers: the `AgentRecorder` SDK, the env wrapper, the spool, the HTTP gateway.

    from producers import AgentRecorder
    rec = AgentRecorder(bootstrap_servers="127.0.0.1:19092", data_dir=".agentstream", agent="my-agent")

Exports resolve lazily, so importing the package (e.g. for `agentstream --help`) stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "AgentRecorder": "producers.recorder",
    "AsyncAgentRecorder": "producers.recorder",
    "Episode": "producers.recorder",
    "RecorderConfig": "producers.recorder",
    "RecordedEnv": "producers.env",
    "Spool": "producers.spool",
    "ProducerError": "producers.errors",
    "RecorderBufferFull": "producers.errors",
    "RecorderClosed": "producers.errors",
    "EpisodeStateError": "producers.errors",
    "SpoolError": "producers.errors",
    "GatewayConfig": "producers.gateway",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'producers' has no attribute {name!r}")
    return getattr(import_module(module), name)
