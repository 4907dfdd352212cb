"""Start the policy server: engine (built-in) and its adapter, recorder, hot reload, HTTP.

`run(...)` is what `agentstream policy` calls once the command has resolved the base model to a
directory (the `tiny` model is built by the top floor, which may import the trainer).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from producers.policy.requests import PolicyConfig

log = logging.getLogger(__name__)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The executor's newest checkpoint under `root` (its `latest` pointer), or None."""
    pointer = Path(root) / "latest"
    if not pointer.exists():
        return None
    return Path(root) / pointer.read_text().strip()


def build_service(config: PolicyConfig, base_dir: Path, bootstrap_servers: str, data_dir: Path):
    """The engine with the adapter to serve at start, and the service recording through the SDK."""
    from producers.policy.engine.local import LocalEngine
    from producers.policy.service import PolicyService
    from producers.redaction_settings import load_redactor

    if config.upstream:
        from producers.policy.upstream import UpstreamEngine

        engine = UpstreamEngine(config.upstream, base_dir)
    else:
        adapter = (
            Path(config.adapter) if config.adapter else latest_checkpoint(_checkpoints(config, data_dir))
        )
        version = _version_of(adapter) if adapter else "base"
        engine = LocalEngine(base_dir, adapter=adapter, version=version, device=config.device)
    return PolicyService(
        engine,
        _recorder(config, bootstrap_servers, data_dir),
        redactor=load_redactor(None, data_dir),  # the recorder's: same settings file, same object
        episode_context_tokens=config.episode_context_tokens,
    )


def _recorder(config: PolicyConfig, bootstrap_servers: str, data_dir: Path):
    if not config.record:
        return None
    from producers.sdk.recorder import AgentRecorder

    return AgentRecorder(bootstrap_servers, data_dir, agent="policy-server")


def _checkpoints(config: PolicyConfig, data_dir: Path) -> Path:
    return Path(config.checkpoints) if config.checkpoints else Path(data_dir) / "checkpoints"


def _version_of(adapter: Path) -> str:
    """A checkpoint directory is named after its policy version (`<root>/<version>[/adapter]`)."""
    return adapter.parent.name if adapter.name == "adapter" else adapter.name


def run(
    config: PolicyConfig,
    base_dir: Path,
    bootstrap_servers: str,
    data_dir: Path,
    host: str,
    port: int,
    ready_file: str | None = None,
) -> int:
    """Serve until SIGTERM / SIGINT; recorded steps are flushed before returning."""
    from producers.policy.reload import PolicyReloader
    from producers.policy.server import serve

    config.check_exposure(host)  # before loading anything: a refusal is immediate
    service = build_service(config, base_dir, bootstrap_servers, data_dir)
    follow = config.follow and not config.upstream  # an upstream server reloads itself
    reloader = PolicyReloader(service, bootstrap_servers).start() if follow else None
    try:
        asyncio.run(serve(config, service, host, port, ready_file))
    except KeyboardInterrupt:
        pass
    finally:
        if reloader is not None:
            reloader.stop()
        if service.recorder is not None:
            service.recorder.close(timeout=30)
    return 0
