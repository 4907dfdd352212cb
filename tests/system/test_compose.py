"""docker-compose.yml for the at-scale path: the services, the learning loop (policy server, executor,
rollout driver, console; vLLM under the `vllm` profile, the judge under `judge`), and every service's
command parsed and validated by the CLI itself under the service's own environment; the servers' keys
are required (without one the file is refused, naming it, before any server restarts forever). A
compose client (`docker compose` or Debian's `docker-compose`) validates the file where one exists;
without one that part skips, saying why."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from urllib.parse import urlsplit

import pytest
import yaml

from consumers.batching.config import BatchBuilderConfig
from consumers.training.config import TrainRunConfig
from infra.cli.main import build_parser
from infra.commands import batch_train
from infra.console.config import ConsoleConfig
from infra.options.configs import config_from_args, config_from_settings
from infra.options.env import apply_env_defaults
from producers.policy.requests import PolicyConfig
from producers.policy.upstream_api import api_base
from producers.rollout.driver import RolloutConfig
from schemas.errors import AgentstreamError
from tests.support.processes import REPO

COMPOSE = REPO / "docker-compose.yml"
LOOP = {"policy", "executor", "rollout", "console", "batch", "worker", "sink"}
PROFILES = ("judge", "vllm")
# What a user must set (docs/operations.md, "At scale"): the keys; the servers refuse to start without.
POLICY_KEY = "policy-key-for-the-rollout-driver"
KEYS = {
    "AGENTSTREAM_POLICY_API_KEY": POLICY_KEY,
    "AGENTSTREAM_POLICY_API_KEY_HASHES": hashlib.sha256(POLICY_KEY.encode()).hexdigest(),
    "AGENTSTREAM_GATEWAY_API_KEY_HASHES": hashlib.sha256(b"gateway-key").hexdigest(),
}
# And what else the docs show: a real base, the judge.
DOCUMENTED = {
    **KEYS,
    "AGENTSTREAM_BASE_MODEL": "/models/qwen2.5-0.5b",
    "AGENTSTREAM_EXPECT_JUDGE": "true",
    "ANTHROPIC_API_KEY": "sk-ant-test",
}
PROXY = {**KEYS, "AGENTSTREAM_POLICY_UPSTREAM": "http://vllm:8000/v1"}  # the vllm profile's line
_VARIABLE = re.compile(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}")


class MissingVariable(Exception):
    """A `${NAME:?message}` whose NAME is unset or empty: compose refuses the file with the message."""


def _value(match: re.Match, env: dict[str, str]) -> str:
    name, kind, text = match[1], match[2], match[3] or ""
    if env.get(name):
        return env[name]
    if kind == ":?":
        raise MissingVariable(f"{name}: {text}")
    return text if kind == ":-" else ""


def interpolate(value, env: dict[str, str]):
    """Compose's `${NAME}`, `${NAME:-default}` (default when unset or empty) and `${NAME:?message}`
    (MissingVariable when unset or empty), through lists and maps."""
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: _value(m, env), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def services_for(env: dict[str, str]) -> dict[str, dict]:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env)["services"]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    return services_for(DOCUMENTED)


def agentstream_services(services: dict[str, dict]) -> list[str]:
    return sorted(name for name, s in services.items() if s.get("image") == "agentstream:local")


def test_services_images_and_kraft(compose):
    services = compose["services"]
    assert LOOP | {"judge", "gateway", "migrate", "topics", "vllm", "kafka", "clickhouse"} <= set(services)
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    assert services["worker"]["deploy"]["replicas"] >= 2
    for name in ("kafka", "clickhouse", "gateway", "policy", "vllm"):
        assert "healthcheck" in services[name], name
    assert {"kafka-data", "clickhouse-data", "agentstream-data"} <= set(compose["volumes"])


def test_published_ports_bind_loopback_only(compose):
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond 127.0.0.1"


def test_agentstream_services_are_configured_by_environment(services):
    for name in set(agentstream_services(services)) - {"topics"}:
        env = services[name]["environment"]
        assert env["AGENTSTREAM_BOOTSTRAP_SERVERS"] == "kafka:9092", name
        assert env["AGENTSTREAM_CLICKHOUSE_URL"] == "http://clickhouse:8123", name
    assert services["judge"]["environment"]["ANTHROPIC_API_KEY"] == "sk-ant-test"


def test_the_loop_runs_on_the_built_in_engine_by_default_and_on_one_base(compose):
    default = services_for(KEYS)  # only what must be set
    assert "profiles" not in default["policy"] and "--upstream" not in " ".join(default["policy"]["command"])
    assert default["policy"]["environment"]["AGENTSTREAM_POLICY_UPSTREAM"] == ""  # built-in engine
    assert default["executor"]["command"][1:3] == ["train", "--follow"]
    defaults = {default[n]["environment"]["AGENTSTREAM_BASE_MODEL"] for n in ("policy", "executor", "batch")}
    assert defaults == {"tiny"}
    services = services_for(DOCUMENTED)
    bases = {services[n]["environment"]["AGENTSTREAM_BASE_MODEL"] for n in ("policy", "executor", "batch")}
    assert bases == {DOCUMENTED["AGENTSTREAM_BASE_MODEL"]}
    assert f"--model={DOCUMENTED['AGENTSTREAM_BASE_MODEL']}" in services["vllm"]["command"]


def _option(command: list[str], flag: str) -> str:
    for i, word in enumerate(command):
        if word == flag:
            return command[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {command}")


def test_the_rollout_driver_reaches_the_policy_server_with_its_key(services):
    policy, rollout = services["policy"], services["rollout"]
    url = urlsplit(_option(rollout["command"], "--policy-url"))
    assert (url.hostname, url.port) == ("policy", int(_option(policy["command"], "--port")))
    assert url.hostname in policy["environment"]["AGENTSTREAM_POLICY_ALLOWED_HOSTS"].split(",")
    assert rollout["environment"]["AGENTSTREAM_ROLLOUT_API_KEY"] == POLICY_KEY
    assert rollout["depends_on"]["policy"]["condition"] == "service_healthy"
    assert "--forever" in rollout["command"]


def test_vllm_profile_runs_on_gpus_behind_the_proxy_and_sees_the_checkpoints(services):
    vllm, policy = services["vllm"], services["policy"]
    assert vllm["profiles"] == ["vllm"] and vllm["image"].startswith("vllm/vllm-openai:")
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    assert (
        "--enable-lora" in vllm["command"]
        and vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    )
    # the proxy hands vLLM its checkpoint paths: the same volume at the same place in both
    data = {v.split(":")[0]: v.split(":")[1] for v in policy["volumes"]}
    assert data["agentstream-data"] == "/data" and "agentstream-data:/data:ro" in vllm["volumes"]
    # the upstream the file's header and the docs tell a user to set is this vLLM
    documented = re.findall(
        r"AGENTSTREAM_POLICY_UPSTREAM=(\S+)",
        COMPOSE.read_text() + (REPO / "docs" / "operations.md").read_text(),
    )
    assert len(documented) >= 2 and PROXY["AGENTSTREAM_POLICY_UPSTREAM"] in documented, documented
    vllm_api = f"http://vllm:{int(_option(vllm['command'], '--port'))}/v1"
    for url in documented:  # as the proxy reads --upstream (a bad URL is its error)
        assert api_base(url) == vllm_api, url


def test_the_policy_server_proxies_to_vllm_with_the_documented_upstream(monkeypatch):
    proxy = services_for(PROXY)
    environment = proxy["policy"]["environment"]
    assert api_base(environment["AGENTSTREAM_POLICY_UPSTREAM"]) == "http://vllm:8000/v1"
    assert check_command(proxy["policy"]["command"], environment, monkeypatch) == "run_policy"
    with pytest.raises(AgentstreamError, match="upstream"):  # the same check refuses a bad one
        api_base(services_for({**PROXY, "AGENTSTREAM_POLICY_UPSTREAM": "ftp://vllm:8000"})["policy"]
                 ["environment"]["AGENTSTREAM_POLICY_UPSTREAM"])  # fmt: skip


def test_the_judge_profile_makes_the_workers_expect_the_judge(compose):
    assert compose["services"]["judge"]["profiles"] == ["judge"]
    assert services_for(KEYS)["worker"]["environment"]["AGENTSTREAM_EXPECT_JUDGE"] == "false"
    assert services_for(DOCUMENTED)["worker"]["environment"]["AGENTSTREAM_EXPECT_JUDGE"] == "true"


# --- every command, as the CLI would run it ------------------------------------------------------

CONFIGS = {  # handler -> the config it builds (its __post_init__ validates the options)
    "run_policy": lambda args: config_from_args(PolicyConfig, args).check_exposure(args.host),
    "run_train": lambda args: batch_train._config(TrainRunConfig, args),
    "run_batch": lambda args: batch_train._config(BatchBuilderConfig, args),
    "run_rollout": lambda args: config_from_args(RolloutConfig, args),
    "run_console": lambda args: config_from_settings(ConsoleConfig, args),
}


def check_command(command: list[str], environment: dict[str, str], monkeypatch) -> str:
    """Parse `command` with the CLI's parser under exactly `environment`, and build the config its
    handler would build (the loop's commands); returns the handler's name. Raises (SystemExit from
    argparse, or the config's error) where the CLI would refuse it."""
    assert command[0] == "agentstream", command
    with monkeypatch.context() as m:
        for name in [n for n in os.environ if n.startswith("AGENTSTREAM_")]:
            m.delenv(name)
        for name, value in environment.items():
            m.setenv(name, str(value))
        parser = build_parser()
        args = parser.parse_args(command[1:])
        apply_env_defaults(parser, args)
        handler = args._handler.__name__
        if handler in CONFIGS:
            CONFIGS[handler](args)
    return handler


def test_every_service_command_is_a_real_cli_command_with_valid_options(services, monkeypatch):
    handlers = {}
    for name in agentstream_services(services):
        service = services[name]
        handlers[name] = check_command(service["command"], service.get("environment", {}), monkeypatch)
    loop = {name: handlers[name] for name in ("policy", "executor", "batch", "rollout", "console")}
    assert set(loop.values()) <= set(CONFIGS), loop  # the loop's configs were built and validated


@pytest.mark.parametrize(
    ("command", "environment"),
    [
        (["agentstream", "train"], {}),  # neither --follow nor --batch
        (["agentstream", "policy", "--no-such-option"], {}),
        (["agentstream", "policy", "--host", "0.0.0.0"], {}),  # exposed without API keys
        (["agentstream", "console", "--host", "0.0.0.0"], {}),
        (["agentstream", "batch"], {"AGENTSTREAM_KINDS": "grpo,ppo"}),  # an unknown kind
        (["agentstream", "no-such-command"], {}),
    ],
)
def test_the_command_check_refuses_what_the_cli_refuses(command, environment, monkeypatch):
    with pytest.raises((SystemExit, AgentstreamError)):
        check_command(command, environment, monkeypatch)


def test_compose_refuses_the_file_without_a_key_naming_it_and_where_to_read(monkeypatch):
    """Without a key the servers would refuse to start and restart forever: compose stops first."""
    for name in KEYS:
        with pytest.raises(
            MissingVariable, match=rf"^{name}: is required - .*docs/operations\.md \(At scale\)"
        ):
            services_for({k: v for k, v in KEYS.items() if k != name})
        with pytest.raises(MissingVariable, match=name):
            services_for({**KEYS, name: ""})
    policy = services_for(KEYS)["policy"]  # and the server itself refuses to start without its keys
    environment = {**policy["environment"], "AGENTSTREAM_POLICY_API_KEY_HASHES": ""}
    with pytest.raises(AgentstreamError, match="needs API keys"):
        check_command(policy["command"], environment, monkeypatch)


def test_the_image_holds_every_package(compose):
    """The Dockerfile copies every top-level package pyproject installs (a missing one breaks every
    service at import)."""
    text = (REPO / "pyproject.toml").read_text()
    packages = re.findall(r'"(\w+)\*"', text.split("[tool.setuptools.packages.find]", 1)[1].split("\n\n")[0])
    copied = set(re.findall(r"^COPY (\w+) \./\1$", (REPO / "Dockerfile").read_text(), flags=re.MULTILINE))
    assert packages and set(packages) <= copied, set(packages) - copied


# --- a compose client, where one exists --------------------------------------------------------


def _compose_cli() -> tuple[list[str] | None, list[str]]:
    """A compose client that answers `version`, and why each candidate was not one."""
    why_not = []
    for candidate in (["docker", "compose"], ["docker-compose"]):
        path = shutil.which(candidate[0])
        if path is None:
            why_not.append(f"no {candidate[0]} on PATH")
            continue
        probe = subprocess.run([*candidate, "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return candidate, why_not
        said = (probe.stderr or probe.stdout).strip().splitlines()
        why_not.append(
            f"`{' '.join(candidate)} version` ({path}) failed: {said[0] if said else probe.returncode}"
        )
    return None, why_not


@pytest.fixture(scope="module")
def compose_cli() -> list[str]:
    # A `docker` CLI without its compose plugin (as Debian's docker.io ships it) cannot check the file.
    cli, why_not = _compose_cli()
    if cli is None:
        pytest.skip("no Docker compose client on this machine: " + "; ".join(why_not))
    return cli


@pytest.mark.parametrize("env", [KEYS, DOCUMENTED, PROXY], ids=["keys", "documented", "proxy"])
def test_docker_compose_config_accepts_the_file_and_resolves_it_as_the_checks_do(compose_cli, env):
    profiles = [word for p in PROFILES for word in ("--profile", p)]
    result = subprocess.run(
        [*compose_cli, "-f", str(COMPOSE), *profiles, "config"],
        capture_output=True, text=True, cwd=REPO, env={"PATH": os.environ["PATH"], **env},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    ours = services_for(env)
    assert set(resolved) == set(ours)
    for name, service in ours.items():  # the commands and environments checked above are these
        for key in ("command", "environment"):
            if key in service:
                assert resolved[name][key] == service[key], (name, key)


def test_docker_compose_config_refuses_the_file_without_the_keys(compose_cli):
    profiles = [word for p in PROFILES for word in ("--profile", p)]
    missing = {k: v for k, v in KEYS.items() if k != "AGENTSTREAM_POLICY_API_KEY_HASHES"}
    result = subprocess.run(
        [*compose_cli, "-f", str(COMPOSE), *profiles, "config"],
        capture_output=True, text=True, cwd=REPO, env={"PATH": os.environ["PATH"], **missing},
    )  # fmt: skip
    said = result.stderr + result.stdout
    assert result.returncode != 0 and "AGENTSTREAM_POLICY_API_KEY_HASHES" in said, said
    assert "docs/operations.md (At scale)" in said, said
