"""`agentstream up`, `agentstream status` and `agentstream demo`."""

from __future__ import annotations

from infra.options.env import add_option, command_parser
from infra.terminal import output
from streams.config import DEFAULT_ROLES

ROLES_HELP = (
    "stream roles, one process each: scoring (rule rewards and trajectory assembly in one consumer, "
    "reading agent.events once; the judge: --judge)"
)
# The stack's optional components, each a switch `--<name>` / `--no-<name>`: name -> what it runs.
# `batch` builds batches, `train` trains on them.
OFF_BY_DEFAULT = {
    "judge": "the LLM judge worker",
    "gateway": "the HTTP gateway",
    "policy": "the policy server (OpenAI-compatible)",
    "train": "the training executor: `train --follow --kinds grpo` on training.batches",
}
ON_BY_DEFAULT = {"console": "the web console", "batch": "the batch builder (`agentstream batch`)"}
# Old names of switches, still accepted (with a note) for one release: new name -> old flag.
RENAMED_SWITCHES = {"batch": "--trainer"}


def register(sub) -> None:
    _register_up(sub)
    status = command_parser(sub, "status", status_command, "per-stage lag, throughput, DLQ")
    add_option(status, "--sample-seconds", type=float, default=1.0, help="throughput sampling window")

    demo = command_parser(
        sub, "demo", demo_command, "run built-in env tasks through rollout, the policy server, the whole loop"
    )
    add_option(
        demo, "--episodes", type=int, default=48, help="episodes: built-in tasks x group size (at most 48)"
    )
    add_option(demo, "--group-size", type=int, default=4, help="rollouts per task (a GRPO group)")
    add_option(demo, "--keep", action="store_true", default=False, help="keep the previous demo data")
    add_option(
        demo,
        "--learn",
        action="store_true",
        default=False,
        help="the training loop instead: warm start, rollouts, GRPO, reloads, held-out eval per version",
    )
    add_option(
        demo,
        "--versions",
        type=int,
        default=1000,
        help="--learn: stop after this many versions (the budget stops it first)",
    )
    add_option(demo, "--budget-min", type=float, default=15.0, help="--learn: stop after this many minutes")
    add_option(demo, "--seed", type=int, default=0, help="--learn: seed of the tasks, model and sampling")


def _register_up(sub) -> None:
    up = command_parser(sub, "up", up_command, "start and supervise the embedded stack")
    add_option(up, "--broker-port", type=int, default=19092, help="embedded broker port")
    add_option(
        up,
        "--workers",
        type=int,
        default=1,
        help="worker slots: one process per stream role (--roles) each",
    )
    add_option(up, "--roles", default=",".join(DEFAULT_ROLES), help=ROLES_HELP)
    for name, what in OFF_BY_DEFAULT.items():
        add_option(up, f"--{name}", action="store_true", default=False, help=f"also run {what}")
    for name, what in ON_BY_DEFAULT.items():
        old = RENAMED_SWITCHES.get(name)
        add_option(up, f"--{name}", action="store_true", default=True, help=f"run {what}", renamed_from=old)
    add_option(up, "--gateway-port", type=int, default=8080, help="gateway port")
    add_option(up, "--policy-port", type=int, default=8000, help="policy server port")
    add_option(up, "--console-port", type=int, default=8090, help="web console port (127.0.0.1)")
    add_option(
        up,
        "--train-args",
        default="",
        help='more `agentstream train` options for --train, one string (e.g. "--base-model DIR --lora-r 16")',
    )
    add_option(
        up,
        "--engine",
        choices=["embedded", "docker", "external"],
        default="embedded",
        help="embedded: our broker + chDB; docker: Kafka + ClickHouse containers via the Docker SDK; "
        "external: use --bootstrap-servers / --clickhouse-url as given",
    )


def demo_command(args) -> int:
    if args.learn:
        from infra.learn.loop import learn_command

        return learn_command(args)
    from infra.demo.run import demo_command as run_demo

    return run_demo(args)


def _stack_config(args):
    import shlex
    from pathlib import Path

    from infra.stack import StackConfig, stack_roles
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    embedded = args.engine == "embedded"  # docker: addresses are filled in once containers run
    bootstrap = f"127.0.0.1:{args.broker_port}" if embedded else settings.bootstrap_servers
    return StackConfig(
        data_dir=Path(settings.data_dir),
        bootstrap_servers=bootstrap,
        clickhouse_url=settings.resolved_clickhouse_url,
        broker_port=args.broker_port,
        embedded_broker=embedded,
        workers=args.workers,
        roles=stack_roles(args.roles),
        judge=bool(args.judge),
        gateway=bool(args.gateway),
        gateway_port=args.gateway_port,
        policy=bool(args.policy),
        policy_port=args.policy_port,
        batch=bool(args.batch),
        console=bool(args.console),
        console_port=args.console_port,
        train=bool(args.train),
        train_args=tuple(shlex.split(args.train_args or "")),
    )


def up_command(args) -> int:
    """Run the stack until SIGTERM or SIGINT (Ctrl-C), then stop it all in reverse start order."""
    from dataclasses import replace

    from infra.stack import StackSupervisor

    config = _stack_config(args)
    containers = None
    if args.engine == "docker":
        from infra.docker_engine import start_docker_stack

        output.say("[up] starting Apache Kafka and ClickHouse containers...")
        containers = start_docker_stack()
        config = replace(
            config, bootstrap_servers=containers.bootstrap_servers, clickhouse_url=containers.clickhouse_url
        )
    supervisor = StackSupervisor(config, on_event=_announce)
    output.say(f"[up] starting stack in {config.data_dir.resolve()} (logs in {config.data_dir / 'logs'})")
    names = ", ".join(supervisor.running)
    console = f"; console at http://127.0.0.1:{config.console_port}/" if config.console else ""
    ready = f"running: {names}; Kafka at {config.bootstrap_servers}{console}; Ctrl-C or SIGTERM stops"
    try:
        supervisor.run(on_ready=lambda: _announce(ready))
    finally:
        if containers is not None:
            containers.stop()
        output.say("[up] stopped")
    return 0


def _announce(message: str) -> None:
    output.say(f"[up] {message}")


def status_command(args) -> int:
    from pathlib import Path

    from infra.stack import read_state
    from infra.status import collect
    from infra.terminal.tables import format_table
    from schemas.settings import Settings

    settings = Settings.from_args(args)
    state = read_state(Path(settings.data_dir))
    bootstrap = state["bootstrap_servers"] if state else settings.bootstrap_servers
    if state:
        rows = [
            {"component": name, "pid": c["pid"], "alive": _alive(c["pid"]), "restarts": c["restarts"]}
            for name, c in state["components"].items()
        ]
        output.say(format_table(rows) + "\n")
    status = collect(bootstrap, sample_s=args.sample_seconds)
    topics = [
        {"topic": t, "records": n, "records/s": round(status.rates.get(t, 0.0), 1)}
        for t, n in sorted(status.end_offsets.items())
    ]
    output.say(format_table(topics) + "\n")
    lags = [{"consumer group": g.group, "topics": ",".join(g.topics), "lag": g.lag} for g in status.groups]
    output.say(format_table(lags) + "\n")
    output.say(f"dead letters: {status.dlq_count}")
    return 0


def _alive(pid) -> bool:
    import os

    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
