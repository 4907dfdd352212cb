"""Exceptions of the `producers` package: the SDK, the spool, delivery, the gateway, the adapters
and the policy server.

`ProducerError` is the root (itself an `AgentstreamError`, which the CLI prints as one line):

    AgentstreamError                (schemas.errors)
    └── ProducerError
        ├── RecorderBufferFull      the in-memory buffer is full and `on_full` gave up
        ├── RecorderClosed          an event was recorded after `close()`
        ├── EpisodeStateError       a step after `end()`, `end()` twice
        ├── SpoolError              the local spool is unusable
        │   └── SpoolLocked         another process owns the spool slot
        ├── DeliveryFailed          a chunk was not acknowledged in time (it stays spooled)
        ├── RequestRejected         a gateway request answered with a 4xx (its JSON body attached)
        ├── AdapterError            an agent log that cannot be converted (`agentstream ingest`)
        ├── EnvError                an unknown or duplicate env id, a bad task file line, a step
        │   │                       before reset() or after the episode ended (producers.envs.errors)
        │   ├── ExpressionError     an expression the safe calculator refuses (producers.envs.calc)
        │   ├── EnvServiceError     a served env's request refused or failed (producers.envs.service)
        │   └── VerdictRefused      a sandbox verdict decided without a test result: the agent's
        │                           diff does not apply, no git (producers.envs.sandbox_verdict)
        ├── SandboxError            a sandbox that cannot be created or used (producers.sandbox)
        │   ├── ChannelError        the local sandbox's program broke the wire protocol, went away or
        │   │                       missed its deadline (producers.sandbox.channel)
        │   ├── _NoAnswer           ... and the call is answered as timed out (producers.sandbox.local)
        │   ├── _NoNamespace        bwrap started but its program never answered (sandbox.namespace)
        │   └── _Expired            an exec's host-side deadline passed (sandbox.container_exec)
        ├── ReplayError             a trajectory that cannot be replayed (producers.rollout.replay)
        ├── EngineError             the policy server cannot load a base model or an adapter
        │                           (producers.policy.engine)
        ├── ApiError                a policy server request answered with an OpenAI-style error
        │   │                       (producers.policy.api_errors)
        │   └── UpstreamError       the proxy's upstream failed: 502 / 503 / 504 naming it (also an
        │                           EngineError, so the reloader counts a failed load; upstream_api)
        └── StreamAbandoned         a stream's client left: its request stops sampling, nothing is
                                    recorded (producers.policy.service)

Messages name the field and the value received.
"""

from __future__ import annotations

from typing import Any

from schemas.errors import AgentstreamError


class ProducerError(AgentstreamError):
    """Root for everything the SDK, the spool, the gateway and the adapters raise on purpose."""


class RecorderBufferFull(ProducerError):
    """The recorder's in-memory buffer is full and its `on_full` policy gave up."""

    def __init__(self, capacity: int, waited_s: float | None = None):
        self.capacity = capacity
        self.waited_s = waited_s
        waited = f" after waiting {waited_s:.3g}s" if waited_s is not None else ""
        super().__init__(
            f"recorder buffer full: buffer_size={capacity} events are waiting to be spooled{waited}; "
            "raise buffer_size, use on_full='block' with a longer block_timeout_s, or record less often"
        )


class RecorderClosed(ProducerError):
    """An event was recorded after `close()`."""


class EpisodeStateError(ProducerError):
    """An episode was used out of order (a step after `end()`, `end()` twice)."""


class SpoolError(ProducerError):
    """The local spool is unusable (locked by another process, or corrupt beyond its torn tail)."""


class SpoolLocked(SpoolError):
    """Another process owns this spool slot."""


class DeliveryFailed(ProducerError):
    """A chunk was not acknowledged in time; its records stay in the spool for a later attempt."""


class RequestRejected(ProducerError):
    """A gateway request answered with a 4xx; `status` is the HTTP status, `body` the JSON answer."""

    def __init__(self, status: int, error: str, errors: list[dict] | None = None, **extra: Any):
        self.status = status
        self.body = {"error": error, "accepted": 0, "errors": errors or [], **extra}
        super().__init__(f"{status} {error}")


class AdapterError(ProducerError):
    """A log that cannot be converted: the message names the file, the field and what was wrong."""
