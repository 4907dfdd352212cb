"""Start the policy server: engine (built-in) and its checkpoint, recorder, hot reload, HTTP.

At start the built-in engine serves `--adapter` when given (an error naming it when it cannot be
loaded), else the newest valid checkpoint under `--checkpoints` (`start_version`: a corrupt or
foreign one is skipped and logged, so a restart never crash-loops), else the base model.

`run(...)` is what `agentstream policy` calls once the command has resolved the base model to a
directory (the `tiny` model is built by the top floor, which may import the trainer).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from producers.policy.requests import PolicyConfig

log = logging.getLogger(__name__)


def build_service(config: PolicyConfig, base_dir: Path, bootstrap_servers: str, data_dir: Path):
    """The engine serving the version to serve at start, and the service recording through the SDK."""
    from producers.policy.engine.local import LocalEngine
    from producers.policy.service import PolicyService
    from producers.policy.start_version import serve_newest
    from producers.redaction_settings import load_redactor

    if config.upstream:
        from producers.policy.upstream import proxy_engine

        start = (Path(config.adapter), _version_of(Path(config.adapter))) if config.adapter else None
        engine = proxy_engine(config, base_dir, start, _checkpoints(config, data_dir))
    else:
        engine = LocalEngine(base_dir, device=config.device)
        if config.adapter:  # the operator's choice: served, or an error naming it
            engine = engine.with_checkpoint(Path(config.adapter), _version_of(Path(config.adapter)))
        else:  # the newest valid checkpoint: a bad one is skipped, never a crash loop
            engine = serve_newest(engine, _checkpoints(config, data_dir))
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


def _version_of(checkpoint: Path) -> str:
    """A checkpoint directory is named after its policy version (`<root>/<version>[/adapter|/model]`)."""
    return checkpoint.parent.name if checkpoint.name in ("adapter", "model") else checkpoint.name


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
    follow = config.follow  # in proxy mode too: the proxy loads each version into its upstream
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
