"""Integration: the trainer process on the real broker never builds a GRPO group across reward
definitions: a mixed group is held for `--group-definition-wait-s`, a late revision that makes it
agree keeps every member, otherwise the odd ones are left out and counted in `batch.built`."""

from __future__ import annotations

import pytest

from clients.kafka import ensure_topics
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.readback import built_batches
from tests.support.sink_harness import publish
from tests.support.trainer_data import golden_group

pytestmark = pytest.mark.integration

JUDGED = "rules+judge@assembly-1+rules-1"
RULES = "rules@assembly-1+rules-1"


def _group(task: str, definitions: list[str], revision: int = 0):
    return [
        t.model_copy(update={"reward_definition": d, "revision": revision})
        for t, d in zip(golden_group(task), definitions, strict=True)
    ]


def test_mixed_groups_wait_for_agreement_then_keep_one_definition(broker, tmp_path):
    ensure_topics(broker.bootstrap)
    args = [*AGENTSTREAM, "batch", "--bootstrap-servers", broker.bootstrap, "--data-dir", str(tmp_path)]
    args += ["--kinds", "grpo", "--retokenize", "--group-size", "4", "--group-timeout-s", "600"]
    args += ["--batch-trajectories", "4", "--flush-interval-s", "0.3", "--group-definition-wait-s", "20"]
    trainer = Proc(args, tmp_path / "trainer.log")
    try:
        # task-a: one member scored without the judge, and it stays so
        publish(broker.bootstrap, _group("task-a", [RULES, JUDGED, JUDGED, JUDGED]))
        # task-b: the same, but the judge's late score gives that member a new revision in time
        late = _group("task-b", [RULES, JUDGED, JUDGED, JUDGED])
        publish(broker.bootstrap, late)
        publish(broker.bootstrap, [late[0].model_copy(update={"reward_definition": JUDGED, "revision": 1})])
        built = wait_for(
            lambda: len(b := built_batches(broker.bootstrap)) >= 2 and b, timeout_s=90, interval_s=0.5,
            what=f"two GRPO batches\n{trainer.log_text()[-3000:]}",
        )  # fmt: skip
    finally:
        trainer.stop()
    by_task = {e.trajectory_ids[0].rsplit("-", 1)[0]: e for e in built}
    a, b = by_task["task-a"], by_task["task-b"]
    assert sorted(a.trajectory_ids) == ["task-a-t2", "task-a-t3", "task-a-t4"]
    assert a.builder_config["left_out_by_definition"] == 1 and a.builder_config["reward_definitions"] == [
        JUDGED
    ]
    assert sorted(b.trajectory_ids) == [f"task-b-t{i}" for i in range(1, 5)]
    assert b.builder_config["left_out_by_definition"] == 0 and b.builder_config["reward_definitions"] == [
        JUDGED
    ]
    assert "left out for their reward definition" in trainer.log_text()
