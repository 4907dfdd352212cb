"""`agentstream rollout`: run episodes of an environment against a policy endpoint, recorded through
the SDK (producers/rollout/). Options are generated from `RolloutConfig`."""

from __future__ import annotations

from infra.options.configs import add_config_options, config_from_args
from infra.options.env import command_parser
from infra.terminal import output
from producers.rollout.driver import RolloutConfig


def register(sub) -> None:
    """Add `rollout` to the `agentstream` parser."""
    parser = command_parser(
        sub, "rollout", run_rollout, "run an environment's tasks against a policy endpoint, recorded"
    )
    add_config_options(parser, RolloutConfig)


def run_rollout(args) -> int:
    import producers.envs  # noqa: F401  (registers the built-in environments)
    from producers.envs.tasks import builtin_tasks, load_tasks
    from producers.rollout.driver import run_recorded
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    config = config_from_args(RolloutConfig, args)
    tasks = load_tasks(config.tasks) if config.tasks else builtin_tasks(config.env)
    tasks = [t for t in tasks if t.env == config.env] or tasks
    total = len(tasks) * config.group_size
    done = {"n": 0, "ok": 0}

    def progress(result) -> None:
        done["n"] += 1
        done["ok"] += result.success
        output.say(
            f"[rollout] {done['n']}/{total if not config.forever else '...'} {result.task_id} "
            f"({result.group_id}): {'solved' if result.success else 'failed'} in {result.turns} turn(s)"
        )

    results = run_recorded(config, tasks, settings.bootstrap_servers, settings.data_dir, progress)
    output.say(f"[rollout] {len(results)} episodes, {sum(r.success for r in results)} solved")
    return 0
