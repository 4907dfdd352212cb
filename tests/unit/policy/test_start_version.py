"""Which version the policy server serves at start (`start_version`), and what the reloader refuses
(`PolicyReloader.apply`), with a stand-in engine: no model is loaded."""

from __future__ import annotations

import json
import logging

import pytest

from producers.policy.engine.errors import EngineError
from producers.policy.reload import PolicyReloader
from producers.policy.start_version import serve_newest, start_candidates
from schemas.events import PolicyUpdated, utc_now

BASE_ID, TOKENIZER = "base-1111", "tok-2222"


class Engine:
    """Serves a version; `with_checkpoint` fails for the paths in `broken` (as a corrupt one does)."""

    base_model_id, tokenizer_hash = BASE_ID, TOKENIZER

    def __init__(self, version="base", broken=(), error=EngineError):
        self.version, self.broken, self.error, self.loaded = version, set(broken), error, []

    def with_checkpoint(self, path, version):
        self.loaded.append(path.name)
        if path.name in self.broken:
            raise self.error(f"checkpoint {path}: cannot load")
        return Engine(version)


def checkpoint(root, version, state=True, base_model_id=BASE_ID, tokenizer_hash=TOKENIZER, latest=False):
    path = root / version
    (path / "model").mkdir(parents=True)
    if state:
        event = {"policy_version": version, "base_model_id": base_model_id, "tokenizer_hash": tokenizer_hash}
        (path / "state.json").write_text(json.dumps({"policy_version": version, "last_event": event}))
    if latest:
        (root / "latest").write_text(version)
    return path


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "producers.policy.start_version"]


def test_candidates_are_latest_then_older_complete_versions_by_number(tmp_path):
    for version in ("v1", "v2", "v10"):
        checkpoint(tmp_path, version)
    checkpoint(tmp_path, "v9", state=False)  # weights written, state.json not yet: incomplete
    checkpoint(tmp_path, "v11", latest=True)
    checkpoint(tmp_path, "v12")  # written after latest, never committed
    (tmp_path / "base").mkdir()
    (tmp_path / "scratch").mkdir()
    (tmp_path / "optimizer.pt.tmp").write_text("x")

    candidates, skipped = start_candidates(tmp_path)

    assert [c.version for c in candidates] == ["v11", "v10", "v2", "v1"]  # by number, not by name
    assert candidates[0].path == tmp_path / "v11" and candidates[0].base_model_id == BASE_ID
    assert sorted(skipped) == [
        f"v12 ({tmp_path / 'v12'}): numbered above latest (v11), never committed",
        f"v9 ({tmp_path / 'v9'}): no state.json, an incomplete checkpoint",
    ]


@pytest.mark.parametrize("pointer", ["../etc", "", "v7", "x" * 300])
def test_a_bad_latest_pointer_is_named_and_the_complete_versions_are_tried(tmp_path, pointer):
    checkpoint(tmp_path, "v1")
    checkpoint(tmp_path, "v3")
    (tmp_path / "latest").write_text(pointer)

    candidates, skipped = start_candidates(tmp_path)

    assert [c.version for c in candidates] == ["v3", "v1"]
    assert len(skipped) == 1 and "latest" in skipped[0]


def test_a_corrupt_state_json_leaves_that_checkpoint_out(tmp_path):
    checkpoint(tmp_path, "v1")
    (checkpoint(tmp_path, "v2") / "state.json").write_text('{"last_event": {"base_model_id": 7}}')
    (checkpoint(tmp_path, "v3") / "state.json").write_text("{not json")
    checkpoint(tmp_path, "v4", latest=True)

    candidates, skipped = start_candidates(tmp_path)

    assert [c.version for c in candidates] == ["v4", "v1"]
    assert len(skipped) == 2
    assert any(line.startswith("v3 (") and "state.json: unreadable" in line for line in skipped)
    assert any(line.startswith("v2 (") and "last_event.base_model_id" in line for line in skipped)


def test_start_serves_the_newest_that_loads_and_logs_each_one_skipped(tmp_path, caplog):
    checkpoint(tmp_path, "v1")
    checkpoint(tmp_path, "v2")
    checkpoint(tmp_path, "v3", latest=True)
    base = Engine(broken={"v3"})

    with caplog.at_level(logging.ERROR):
        served = serve_newest(base, tmp_path)

    assert served.version == "v2" and base.loaded == ["v3", "v2"]
    [line] = messages(caplog)
    assert "v3" in line and str(tmp_path / "v3") in line and "cannot load" in line


def test_start_survives_any_loader_error_and_falls_back_to_the_base(tmp_path, caplog):
    checkpoint(tmp_path, "v1")
    checkpoint(tmp_path, "v2", latest=True)
    base = Engine(broken={"v1", "v2"}, error=RuntimeError)

    with caplog.at_level(logging.WARNING):
        served = serve_newest(base, tmp_path)

    assert served is base and base.loaded == ["v2", "v1"]
    lines = messages(caplog)
    assert len(lines) == 3 and "RuntimeError" in lines[0] and "v1" in lines[1]
    assert "serving base" in lines[2]


def test_start_skips_a_version_built_on_another_base(tmp_path, caplog):
    checkpoint(tmp_path, "v1")
    checkpoint(tmp_path, "v2", base_model_id="other-base", latest=True)
    checkpoint(tmp_path, "v3", tokenizer_hash="other-tok")  # uncommitted anyway

    with caplog.at_level(logging.ERROR):
        served = serve_newest(Engine(), tmp_path)

    assert served.version == "v1"
    foreign = [line for line in messages(caplog) if "another base" in line]
    assert len(foreign) == 1 and "other-base" in foreign[0] and BASE_ID in foreign[0]


def test_start_with_no_checkpoints_serves_the_base_quietly(tmp_path, caplog):
    base = Engine()
    with caplog.at_level(logging.INFO):
        assert serve_newest(base, tmp_path / "none") is base
        assert serve_newest(base, tmp_path) is base
    assert messages(caplog) == [] and base.loaded == []


# --- the reloader ------------------------------------------------------------------------------


class Service:
    def __init__(self, engine):
        self.engine = engine

    def swap(self, engine):
        self.engine = engine


def update(version, path="/ckpt/x", **base) -> PolicyUpdated:
    return PolicyUpdated(event_id=f"e-{version}", trajectory_id=version, occurred_at=utc_now(),
                         producer="tests", policy_version=version, checkpoint_path=path, **base)  # fmt: skip


def reload_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "producers.policy.reload"]


@pytest.mark.parametrize(
    ("base", "theirs", "ours"),
    [
        ({"base_model_id": "other-base"}, "other-base", BASE_ID),
        ({"base_model_id": BASE_ID, "tokenizer_hash": "other-tok"}, "other-tok", TOKENIZER),
    ],
)
def test_the_reloader_refuses_a_version_built_on_another_base(base, theirs, ours, caplog):
    service = Service(Engine("v1"))
    reloader = PolicyReloader(service, "127.0.0.1:1")

    with caplog.at_level(logging.ERROR):
        assert reloader.apply(update("v2", **base)) is False

    assert service.engine.version == "v1" and service.engine.loaded == []
    assert reloader.refused == ["v2"] and reloader.failures == []
    [line] = reload_lines(caplog)
    assert "v2 refused" in line and theirs in line and ours in line and "still serving v1" in line


def test_the_reloader_compares_only_what_both_sides_know(caplog):
    service = Service(Engine("v1"))
    service.engine.base_model_id = ""  # an engine that does not know its base (a tokenizer-only proxy)
    reloader = PolicyReloader(service, "127.0.0.1:1")

    assert reloader.apply(update("v2", base_model_id="any", tokenizer_hash=TOKENIZER)) is True
    assert reloader.apply(update("v3")) is True  # an event from before the fields: not compared
    assert service.engine.version == "v3" and reloader.refused == []


def test_a_failed_load_of_any_kind_keeps_the_old_version_and_says_why(caplog):
    service = Service(Engine("v1", broken={"v2"}, error=MemoryError))
    reloader = PolicyReloader(service, "127.0.0.1:1")

    with caplog.at_level(logging.ERROR):
        assert reloader.apply(update("v2", "/ckpt/v2")) is False
        assert reloader.apply(update("v3", "")) is False

    assert service.engine.version == "v1" and reloader.failures == ["v2", "v3"]
    first, second = reload_lines(caplog)
    assert "v2 not served (MemoryError" in first and "/ckpt/v2" in first
    assert "v3 not served (checkpoint_path: empty" in second
