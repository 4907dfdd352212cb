"""`agentstream sink` options generated from `SinkConfig` (help, env fallback, validation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.errors import ConsumerConfigError
from consumers.sink.runner import SinkConfig, write_ready_file
from infra.cli.main import build_parser
from infra.options.configs import config_from_args
from infra.options.env import apply_env_defaults


def _config(argv: list[str]) -> SinkConfig:
    parser = build_parser()
    args = parser.parse_args(["sink", *argv])
    apply_env_defaults(parser, args)
    return config_from_args(SinkConfig, args, bootstrap_servers="b:1", clickhouse_url="chdb:///x")


def test_sink_flags_and_env_vars_build_the_config(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTSTREAM_MAX_RETRY_S", "7")
    config = _config(["--batch-rows", "10", "--from-beginning", "--ready-file", str(tmp_path / "r")])
    assert (config.batch_rows, config.max_retry_s, config.from_beginning) == (10, 7.0, True)
    assert config.ready_file == tmp_path / "r" and config.group_id == "agentstream-sink"
    assert config.bootstrap_servers == "b:1" and config.clickhouse_url == "chdb:///x"


def test_sink_rejects_a_bad_option_naming_it():
    with pytest.raises(ConsumerConfigError, match=r"--batch-rows: must be >= 1, got 0"):
        _config(["--batch-rows", "0"])


def test_ready_file_is_written_whole(tmp_path):
    path = Path(tmp_path / "ready")
    write_ready_file(path, "http://127.0.0.1:1234")
    assert path.read_text() == "http://127.0.0.1:1234" and not path.with_suffix(".tmp").exists()
