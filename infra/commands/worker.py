"""`agentstream worker`: run stream processors (`scoring`: rule rewards and trajectory assembly;
`judge`: the LLM judge).

Its options are generated from `streams.config.WorkerConfig`: adding a worker option is adding a
documented field there. One role runs in this process; several run as one child process per role
under `infra.supervisor.Supervisor` (the one `agentstream up` uses), each child given the same
options by `config_to_argv`.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from infra.options.configs import add_config_options, config_from_args, config_to_argv
from infra.options.env import command_parser
from schemas.settings import Settings
from streams.config import WorkerConfig

log = logging.getLogger(__name__)


def register(sub) -> None:
    """Add `worker` to the `agentstream` parser."""
    parser = command_parser(
        sub,
        "worker",
        run_worker,
        "run stream processors (faust): scoring (rule rewards + trajectory assembly), LLM judge",
    )
    add_config_options(parser, WorkerConfig)


def run_worker(args) -> int:
    settings = Settings.from_args(args)
    config = config_from_args(
        WorkerConfig, args, bootstrap_servers=settings.bootstrap_servers, data_dir=settings.data_dir
    )
    if len(config.roles) == 1:
        from streams import worker

        return worker.main(config, args.log_level)
    return supervise_roles(config, log_level=args.log_level, clickhouse_url=args.clickhouse_url)


def supervise_roles(config: WorkerConfig, log_level: str = "INFO", clickhouse_url: str | None = None) -> int:
    """One child per role. A role that exits with EXIT_REPLAY is restarted (with backoff); any other
    exit stops them all and returns 1; SIGTERM / SIGINT stop them all and return 0."""
    from infra.supervisor import Component, Supervisor

    config = replace(config, expect_judge=config.expect_judge or "judge" in config.roles)
    children = [
        Component(role, ("worker", *config_to_argv(replace(config, roles=(role,)))), restart="replay")
        for role in config.roles
    ]
    # the settings every command shares are not worker options: the children read them from the env
    env = {
        "AGENTSTREAM_BOOTSTRAP_SERVERS": config.bootstrap_servers,
        "AGENTSTREAM_DATA_DIR": str(config.data_dir),
        "AGENTSTREAM_LOG_LEVEL": str(log_level),
    }
    if clickhouse_url:
        env["AGENTSTREAM_CLICKHOUSE_URL"] = clickhouse_url
    supervisor = Supervisor(children, env=env, on_event=lambda message: log.warning("worker: %s", message))
    return supervisor.run()
