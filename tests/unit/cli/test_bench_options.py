"""`agentstream bench NAME --repeats N`: a count below 1 is refused by the parser with the value named,
from the command line and from `AGENTSTREAM_REPEATS`, before any benchmark starts anything."""

from __future__ import annotations

import doctest

import pytest

from infra.cli.main import main
from infra.options import env as options


def test_the_type_behind_it_keeps_its_examples():
    assert doctest.testmod(options).failed == 0


@pytest.mark.parametrize("value", ["0", "-2", "three"])
def test_repeats_below_one_is_refused_naming_the_value(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "e2e", "--repeats", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--repeats" in err and f"got {value!r}" in err


def test_repeats_from_the_environment_is_checked_the_same_way(monkeypatch, capsys):
    monkeypatch.setenv("AGENTSTREAM_REPEATS", "0")
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "codec"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "AGENTSTREAM_REPEATS='0': expected a whole number of at least 1, got '0'" in err
