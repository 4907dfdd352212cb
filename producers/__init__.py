"""agentstream producers: the `AgentRecorder` SDK (`sdk/`), the HTTP gateway with OTLP (`gateway/`),
log adapters, environments and their recorder (`envs/`), the policy server and the rollout driver.

    from producers import AgentRecorder
    rec = AgentRecorder(bootstrap_servers="127.0.0.1:19092", data_dir=".agentstream", agent="my-agent")

Exports resolve lazily, so importing the package (e.g. for `agentstream --help`) stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentRecorder",
    "AsyncAgentRecorder",
    "Episode",
    "EpisodeStateError",
    "GatewayConfig",
    "ProducerError",
    "RecorderBufferFull",
    "RecorderClosed",
    "RecorderConfig",
    "Spool",
    "SpoolError",
]


def __getattr__(name: str) -> Any:
    """Import an export on first use (plain imports, so a renamed module fails lint, not users)."""
    if name in ("AgentRecorder", "AsyncAgentRecorder", "Episode"):
        from producers.sdk import recorder

        return getattr(recorder, name)
    if name == "RecorderConfig":
        from producers.sdk.pipeline import RecorderConfig

        return RecorderConfig
    if name in ("ProducerError", "RecorderBufferFull", "RecorderClosed", "EpisodeStateError", "SpoolError"):
        from producers import errors

        return getattr(errors, name)
    if name == "Spool":
        from producers.sdk.spool import Spool

        return Spool
    if name == "GatewayConfig":
        from producers.gateway.requests import GatewayConfig

        return GatewayConfig
    raise AttributeError(f"module 'producers' has no attribute {name!r}")
