"""`agentstream policy`: serve the current policy behind an OpenAI-compatible API, recording what it
samples (producers/policy/). Options are generated from `PolicyConfig`; `--base-model tiny` is
built here (from a config, no download) because the tiny model lives with the trainer.
"""

from __future__ import annotations

from pathlib import Path

from infra.options.configs import add_config_options, config_from_args
from infra.options.env import add_option, command_parser
from producers.policy.requests import PolicyConfig


def register(sub) -> None:
    """Add `policy` to the `agentstream` parser."""
    parser = command_parser(
        sub, "policy", run_policy, "serve the policy (OpenAI-compatible API) and record what it samples"
    )
    add_option(parser, "--host", default="127.0.0.1", help="address to bind")
    add_option(parser, "--port", type=int, default=8000, help="port to bind (0: any free port)")
    add_config_options(parser, PolicyConfig)
    add_option(parser, "--ready-file", help="write host:port here once listening")


def base_model_dir(base_model: str, data_dir: Path) -> Path:
    """`tiny` -> the tiny model built under `data_dir` (once); anything else is a local directory."""
    if base_model == "tiny":
        from consumers.tiny_model import tiny_model_dir

        return tiny_model_dir(data_dir)
    return Path(base_model)


def run_policy(args) -> int:
    from producers.policy.runner import run
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    config = config_from_args(PolicyConfig, args)
    base = base_model_dir(config.base_model, Path(settings.data_dir))
    return run(
        config,
        base,
        settings.bootstrap_servers,
        Path(settings.data_dir),
        args.host,
        args.port,
        args.ready_file,
    )
