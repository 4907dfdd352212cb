"""Acceptance (#17, reward definitions as data): an always-failing judge endpoint, everything real.

The embedded broker over TCP, one `agentstream worker` (scoring, judge) whose judge calls
the local Messages-API server with the real anthropic SDK (every call answered 500), the trainer
building GRPO groups and the sink writing chDB. What a user sees: each trajectory says its judge
layer is missing and why, no judge score is made up (a step's process score is its rule score),
rule rewards keep flowing into complete trajectories, every GRPO group is built under one reward
definition, and ClickHouse holds the definition and the reasons.
"""

from __future__ import annotations

import random

import pytest

from clients.kafka import ensure_topics
from consumers.batching.batch_writer import BatchStore
from schemas import topics
from schemas.events import EpisodeStarted
from tests.support.judge_servers.messages import MessagesServer
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.sink_harness import reader, rows, start_sink
from tests.support.streams_helpers import make_trajectory, publish, read_topic, worker_args

pytestmark = pytest.mark.integration

GROUPS, SIZE, STEPS = 2, 4, 3
RULES_ONLY = "rules@assembly-1+rules-1"


def _events() -> list:
    rng, out = random.Random(17), []
    for g in range(GROUPS):
        for m in range(SIZE):
            events = make_trajectory(f"fj-{g}-{m}", STEPS, rng)
            started: EpisodeStarted = events[0]
            group = {"task_id": f"fj-task-{g}", "group_id": f"fj-group-{g}"}
            out += [started.model_copy(update=group), *events[1:]]
    return out


def _latest(bootstrap: str) -> dict:
    latest = {}
    for t in read_topic(bootstrap, topics.TRAJECTORY_SCORED):
        if t.revision >= getattr(latest.get(t.trajectory_id), "revision", -1):
            latest[t.trajectory_id] = t
    return latest


def _all_assembled(bootstrap: str):
    latest = _latest(bootstrap)
    done = len(latest) == GROUPS * SIZE and all(t.missing for t in latest.values())
    return done and latest


def _trainer(bootstrap: str, data_dir, log_path) -> Proc:
    args = [*AGENTSTREAM, "batch", "--bootstrap-servers", bootstrap, "--data-dir", str(data_dir)]
    args += ["--kinds", "grpo", "--retokenize", "--group-size", str(SIZE), "--group-timeout-s", "600"]
    args += ["--batch-trajectories", str(GROUPS * SIZE), "--flush-interval-s", "0.3"]
    return Proc(args, log_path)


def test_an_always_failing_judge_is_a_missing_layer_not_a_score(broker, clickhouse_url, tmp_path):
    ensure_topics(broker.bootstrap)
    judge_rules = tmp_path / "judge-rules.yaml"
    judge_rules.write_text("rules:\n  - name: all\n    mode: trajectory\n")
    env = {
        "ANTHROPIC_API_KEY": "dummy-key",
        "AGENTSTREAM_JUDGE_MAX_ATTEMPTS": "2",
        "AGENTSTREAM_JUDGE_BACKOFF_BASE_S": "0.05",
    }
    args = worker_args(broker.bootstrap, tmp_path / "worker", "scoring,judge")
    args += ["--judge-rules", str(judge_rules), "--grace-seconds", "120"]  # the failures end the wait
    store = BatchStore(tmp_path / "trainer")
    with MessagesServer() as server:
        server.fail_status = 500
        worker = Proc(args, tmp_path / "worker.log", env | {"AGENTSTREAM_JUDGE_BASE_URL": server.url})
        trainer = _trainer(broker.bootstrap, tmp_path / "trainer", tmp_path / "trainer.log")
        sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
        try:
            publish(broker.bootstrap, topics.AGENT_EVENTS, _events())
            latest = wait_for(
                lambda: _all_assembled(broker.bootstrap), timeout_s=180, interval_s=0.5,
                what=f"{GROUPS * SIZE} trajectories without a judge layer\n{worker.log_text()[-3000:]}",
            )  # fmt: skip
            wait_for(
                lambda: sum(len(m.trajectory_ids) for m in store.manifests("grpo")) >= GROUPS * SIZE,
                timeout_s=90, interval_s=0.3, what=f"the GRPO batches\n{trainer.log_text()[-3000:]}",
            )  # fmt: skip
            client = reader(clickhouse_url)
            stored = wait_for(
                lambda: (r := _stored(client)) and len(r) == GROUPS * SIZE and r,
                timeout_s=90, interval_s=0.5, what="the trajectories in ClickHouse",
            )  # fmt: skip
            judged = read_topic(broker.bootstrap, topics.REWARD_JUDGE)
            rules = read_topic(broker.bootstrap, topics.REWARD_RULE)
        finally:
            sink.proc.stop()
            trainer.stop()
            worker.stop()
        assert server.statuses and set(server.statuses) == {500}  # the judge was called, and failed

    # the judge wrote failures only, never a score
    assert {e.type for e in judged} == {"reward.judge.failed"}
    assert {e.trajectory_id for e in judged} == set(latest)
    # rule rewards kept flowing into complete trajectories that say the judge layer is missing
    assert len({(e.trajectory_id, e.step_index) for e in rules}) == GROUPS * SIZE * STEPS
    for t in latest.values():
        assert t.complete and t.missing == ["reward.judge.trajectory"], t.missing
        assert t.reward_definition == RULES_ONLY
        for s in t.steps:
            assert s.layers == ["rules"] and s.judge_score is None and s.judge_scores == {}
            assert s.missing_layers["judge"].startswith("failed ("), s.missing_layers
            assert s.process_score == s.rule_score  # from the present layer only: nothing made up
    # every GRPO group was built under the one definition, none left out
    batches = store.manifests("grpo")
    assert {i for m in batches for i in m.trajectory_ids} == set(latest)
    for m in batches:
        assert m.builder_config["reward_definitions"] == [RULES_ONLY]
        assert m.builder_config["left_out_by_definition"] == 0
    # ClickHouse has the definition, the layers and the reasons
    for tid, (definition, layers, missing, counts) in stored.items():
        assert definition == RULES_ONLY and layers == [["rules"]] * STEPS
        assert [set(m) for m in missing] == [{"judge"}] * STEPS and counts == {"judge": STEPS}
        assert missing[0]["judge"] == latest[tid].steps[0].missing_layers["judge"]


def _stored(client) -> dict:
    found = rows(
        client,
        "SELECT trajectory_id, reward_definition, step_layers, step_missing_layers, missing_layers "
        "FROM agentstream.trajectories FINAL WHERE trajectory_id LIKE 'fj-%'",
    )
    return {r[0]: r[1:] for r in found}
