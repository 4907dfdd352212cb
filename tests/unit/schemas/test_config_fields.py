"""`option` fields: the CLI generator reads their help/flag/env, and `check_bounds` names the option."""

from __future__ import annotations

import argparse
import doctest
from dataclasses import dataclass
from pathlib import Path

import pytest

import schemas.config_fields
import schemas.json_input
from infra.options.configs import add_config_options, config_from_args
from infra.options.env import apply_env_defaults
from schemas.config_fields import check_bounds, option
from schemas.json_input import json_object


@dataclass(frozen=True)
class _Config:
    wait_ms: int = option(25, "longest wait", env="AGENTSTREAM_TEST_WAIT_MS", ge=0)
    rules: Path | None = option(None, "rules file", flag="--rules")
    ratio: float = option(0.5, "a share", gt=0, le=1)

    def __post_init__(self):
        check_bounds(self, ValueError)


@pytest.mark.parametrize("module", [schemas.config_fields, schemas.json_input])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_the_cli_is_generated_from_option_fields(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_TEST_WAIT_MS", "7")
    parser = argparse.ArgumentParser()
    add_config_options(parser, _Config)
    args = parser.parse_args(["--rules", "r.yaml", "--ratio", "1"])
    apply_env_defaults(parser, args)
    config = config_from_args(_Config, args)
    assert config == _Config(wait_ms=7, rules=Path("r.yaml"), ratio=1.0)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"wait_ms": -1}, "--wait-ms: must be >= 0, got -1"),
        ({"ratio": 0.0}, "--ratio: must be > 0, got 0.0"),
        ({"ratio": 1.5}, "--ratio: must be <= 1, got 1.5"),
    ],
)
def test_a_value_out_of_bounds_names_the_option_and_the_value(given, message):
    with pytest.raises(ValueError) as refused:
        _Config(**given)
    assert str(refused.value) == message


def test_json_object_names_where_the_text_is_not_json():
    with pytest.raises(KeyError, match=r"tasks\.jsonl:3: not valid JSON"):
        json_object("{nope", "tasks.jsonl:3", KeyError)
