"""Integration: with two reward versions of the same trajectories on `trajectory.scored` (the live
assembler's and a replay's), the trainer process batches only the version it is given with
`--reward-version` (default: the live rules version, rules-1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.kafka import ensure_topics
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.readback import built_batches
from tests.support.sink_harness import publish
from tests.support.trainer_data import golden_group

pytestmark = pytest.mark.integration
LIVE, REPLAY = "assembly-1+rules-1", "assembly-1+rules-2"


def _versions() -> list:
    """task-a under the live version (t1 best) and under a replay's (rewards reversed: t4 best)."""
    live = [t.model_copy(update={"reward_version": LIVE}) for t in golden_group("task-a")]
    replay = [
        t.model_copy(update={"reward_version": REPLAY, "event_id": f"{t.event_id}-r2", "total_reward": 1 - r})
        for t, r in zip(live, [t.total_reward for t in live], strict=True)
    ]
    return [*live, *replay]


def _trainer(bootstrap: str, workdir: Path, name: str, *extra: str) -> Proc:
    workdir.mkdir()
    args = [*AGENTSTREAM, "batch", "--bootstrap-servers", bootstrap, "--data-dir", str(workdir)]
    args += ["--group-id", f"trainer-{name}", "--kinds", "grpo", "--retokenize", "--group-size", "4"]
    args += ["--batch-trajectories", "4", "--flush-interval-s", "0.3", *extra]
    return Proc(args, workdir / "trainer.log")


def test_the_trainer_batches_only_the_selected_reward_version(broker, tmp_path):
    ensure_topics(broker.bootstrap)
    publish(broker.bootstrap, _versions())
    replay = _trainer(broker.bootstrap, tmp_path / "replay", "replay", "--reward-version", "rules-2")
    live = _trainer(broker.bootstrap, tmp_path / "live", "live")
    try:
        built = wait_for(
            lambda: len(b := built_batches(broker.bootstrap)) >= 2 and b, timeout_s=120, interval_s=0.5,
            what=f"two GRPO batches\n{replay.log_text()[-2000:]}\n{live.log_text()[-2000:]}",
        )  # fmt: skip
    finally:
        replay.stop()
        live.stop()
    assert sorted(tuple(e.reward_versions) for e in built) == [(LIVE,), (REPLAY,)]
    for event in built:
        assert sorted(event.trajectory_ids) == [f"task-a-t{i}" for i in range(1, 5)]
        rows = [json.loads(line) for line in Path(event.path).read_text().splitlines()]
        advantage = {r["trajectory_id"]: r["advantage"] for r in rows}
        best = "task-a-t4" if event.reward_versions == [REPLAY] else "task-a-t1"
        assert max(advantage, key=advantage.get) == best, (event.reward_versions, advantage)
    assert "skipping trajectories of reward version assembly-1+rules-1" in replay.log_text()
