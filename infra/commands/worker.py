"""`agentstream worker`: run stream processors (rule rewards, trajectory assembler, judge).

Its options are generated from `streams.config.WorkerConfig`: adding a worker option is adding a
documented field there.
"""

from __future__ import annotations

from infra.cli.configs import add_config_options, config_from_args
from infra.cli.options import command_parser
from schemas.settings import Settings
from streams import worker
from streams.config import WorkerConfig


def register(sub) -> None:
    """Add `worker` to the `agentstream` parser."""
    parser = command_parser(
        sub,
        "worker",
        run_worker,
        "run stream processors (faust): rule rewards, trajectory assembly, LLM judge",
    )
    add_config_options(parser, WorkerConfig)


def run_worker(args) -> int:
    settings = Settings.from_args(args)
    config = config_from_args(
        WorkerConfig, args, bootstrap_servers=settings.bootstrap_servers, data_dir=settings.data_dir
    )
    return worker.main(config, args)
