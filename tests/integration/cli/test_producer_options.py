"""`agentstream gateway` and `agentstream ingest` options come from their config dataclasses and
keep their flag names and environment variables."""

from __future__ import annotations

from infra.cli.main import build_parser
from infra.options.configs import config_from_args
from infra.options.env import apply_env_defaults
from producers.adapters.ingest import IngestConfig
from producers.gateway.requests import GatewayConfig, hash_key


def _parse(argv: list[str]):
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_env_defaults(parser, args)
    return args


def test_gateway_key_hashes_come_from_the_flag_or_the_environment(monkeypatch):
    digest = hash_key("k1")
    args = _parse(["gateway", "--api-key-hashes", f" {digest.upper()} ,", "--max-events", "7"])
    config = config_from_args(GatewayConfig, args, bootstrap_servers="b:1")
    assert config.api_key_hashes == frozenset({digest}) and config.max_events == 7
    assert config.max_body_bytes == 4 * 1024 * 1024 and config.client == "kafka-python"

    monkeypatch.setenv("AGENTSTREAM_GATEWAY_API_KEY_HASHES", f"{digest},{hash_key('k2')}")
    config = config_from_args(GatewayConfig, _parse(["gateway"]), bootstrap_servers="b:1")
    assert config.api_key_hashes == frozenset({digest, hash_key("k2")})


def test_gateway_config_keeps_key_hashes_as_a_frozenset_of_lowercase_digests():
    digest = hash_key("k")
    assert GatewayConfig("b:1", api_key_hashes=(digest.upper(),)).api_key_hashes == frozenset({digest})
    assert GatewayConfig("b:1", api_key_hashes=frozenset({digest})).api_key_hashes == frozenset({digest})


def test_ingest_options_build_its_config(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_DOMAIN", "coding")
    args = _parse(["ingest", "x.json", "--format", "openai", "--dry-run", "--model", "m"])
    config = config_from_args(IngestConfig, args)
    assert config == IngestConfig(format="openai", domain="coding", model="m", dry_run=True)
    assert args.paths == ["x.json"] and args.json is False
