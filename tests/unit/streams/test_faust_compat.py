"""streams/faust_compat.py owns every private faust access: each attribute it relies on exists on
the installed faust, and a faust series it was not written for is refused with a clear error."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from streams import faust_compat
from streams.errors import FaustVersionError, StreamsError


@pytest.mark.parametrize(("path", "attribute"), faust_compat.CLASS_ATTRIBUTES)
def test_every_class_attribute_it_relies_on_exists(path, attribute):
    module_name, class_name = path.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    assert hasattr(cls, attribute), f"{path} has no {attribute}: faust_compat needs updating"


def test_every_instance_attribute_it_relies_on_exists(tmp_path):
    faust = faust_compat.import_faust()
    app = faust.App(
        "compat-check",
        broker="kafka://127.0.0.1:1",
        store="memory://",
        web_enabled=False,
        datadir=str(tmp_path),
    )
    for path, attribute in faust_compat.INSTANCE_ATTRIBUTES:
        owner = app
        for part in path.split("."):
            owner = getattr(owner, part)
        assert hasattr(owner, attribute), f"app.{path} has no {attribute}: faust_compat needs updating"
    table = app.Table("compat-check", default=None)
    assert hasattr(faust_compat.table_store(table), "get")
    assert faust_compat.committed_offsets(app) == {}
    assert faust_compat.recovery_completed(app) in (True, False)


def test_the_recovery_fixes_are_applied_once():
    faust = faust_compat.import_faust()
    from faust.tables.recovery import Recovery

    assert Recovery.on_recovery_completed is faust_compat._on_recovery_completed
    assert faust_compat.import_faust() is faust


def test_another_faust_series_is_refused_with_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "faust", types.SimpleNamespace(__version__="0.16.0"))
    with pytest.raises(FaustVersionError) as info:
        faust_compat.import_faust()
    assert isinstance(info.value, StreamsError)
    assert "faust-streaming 0.16.0 is installed" in str(info.value)
    assert "0.15.x" in str(info.value)
