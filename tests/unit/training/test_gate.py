"""The evaluation gate's pure decision (one-sided exact McNemar), `Gate.check` (decision saved in the
checkpoint before the event is returned for publishing), the follower seams, the current-policy
reader skipping refused versions, the sink row and the lineage line."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from clients.current_policy import CurrentPolicyReader
from clients.kafka.consume import refusal
from consumers.errors import ConsumerConfigError, TrainerError
from consumers.sink.rows import COLUMNS, policy_version_row
from consumers.training import checkpoints, follow, group_work
from consumers.training.checkpoints import restore_target
from consumers.training.config import TrainConfig, TrainRunConfig
from consumers.training.distributed import Ranks
from consumers.training.executor import TrainingExecutor
from consumers.training.gate import Gate, GateUnavailable, PairedOutcomes, decide, worse_p_value
from consumers.training.versions import TrainState
from infra.learn.tasks import TOOLS, demonstration
from infra.lineage import format_lineage, gate_line
from schemas.codec import encode
from schemas.events import BatchBuilt, PolicyUpdated, utc_now
from schemas.records import Record


def binomial_upper_tail(k: int, n: int) -> float:
    """P(X >= k), X ~ Bin(n, 1/2), summed term by term (an independent reference)."""
    return sum(math.comb(n, i) * 0.5**n for i in range(k, n + 1))


@pytest.mark.parametrize(("worse", "better"), [(5, 0), (8, 2), (3, 3), (0, 4), (10, 1), (1, 0), (12, 9)])
def test_worse_p_value_is_the_binomial_upper_tail(worse, better):
    assert worse_p_value(worse, better) == pytest.approx(binomial_upper_tail(worse, worse + better))


def test_worse_p_value_known_values_and_scipy_when_installed():
    assert worse_p_value(5, 0) == 1 / 32
    assert worse_p_value(8, 2) == pytest.approx(56 / 1024)
    assert worse_p_value(0, 0) == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")
    for worse, better in ((7, 1), (4, 6), (20, 9)):
        expected = scipy_stats.binomtest(worse, worse + better, 0.5, alternative="greater").pvalue
        assert worse_p_value(worse, better) == pytest.approx(expected)


def test_decide_refuses_a_significantly_worse_candidate_and_counts_the_pairs():
    serving = [True] * 7 + [False, True]
    candidate = [False] * 7 + [True, True]
    d = decide(serving, candidate, 0.05)
    assert (d.figures["worse"], d.figures["better"], d.figures["episodes"]) == (7.0, 1.0, 9.0)
    assert d.figures["p_worse"] == pytest.approx(9 / 256)  # P(X >= 7 | n = 8) = (8 + 1) / 256
    assert d.verdict == "refused"
    assert (d.figures["serving_rate"], d.figures["candidate_rate"]) == (8 / 9, 2 / 9)
    one_fewer = decide(serving[1:], candidate[1:], 0.05)  # 6 worse, 1 better: p = 8 / 128
    assert one_fewer.figures["p_worse"] == pytest.approx(8 / 128) and one_fewer.verdict == "accepted"


def test_decide_threshold_is_strict_and_ties_are_accepted():
    serving, candidate = [True] * 5, [False] * 5  # p = 1/32
    assert decide(serving, candidate, 0.05).verdict == "refused"
    assert decide(serving, candidate, 1 / 32).verdict == "accepted"  # p < alpha refuses, p == alpha not
    assert decide([True, False] * 4, [False, True] * 4, 0.05).verdict == "accepted"
    assert decide([False] * 9, [True] * 9, 0.05).verdict == "accepted"  # better is never refused
    assert decide([True] * 9, [True] * 9, 0.05).figures["p_worse"] == 1.0


def test_decide_refuses_bad_input_naming_it():
    with pytest.raises(TrainerError, match="--gate-alpha"):
        decide([True], [False], 1.0)
    with pytest.raises(TrainerError, match="3 and 2"):
        decide([True] * 3, [True] * 2, 0.05)
    with pytest.raises(TrainerError, match="episode by episode"):
        PairedOutcomes("v1", (True,), (True, False))


# --- Gate.check: the decision is saved in the checkpoint state before the event is returned -------


def _update(version: str, ckpt_root: Path, **extra) -> PolicyUpdated:
    return PolicyUpdated(
        event_id=f"pu-{version}", trajectory_id=version, occurred_at=utc_now(), producer="test",
        policy_version=version, checkpoint_path=str(ckpt_root / version), method="sft", **extra,
    )  # fmt: skip


def _checkpointed(tmp_path: Path, version: str = "v2") -> tuple[TrainState, PolicyUpdated]:
    ckpt_root = tmp_path / "checkpoints"
    (ckpt_root / version).mkdir(parents=True)
    event = _update(version, ckpt_root)
    state = TrainState(step=3, policy_version=version, versions=2, last_event=event.model_dump(mode="json"))
    (ckpt_root / version / "state.json").write_text(json.dumps(asdict(state)))
    return state, event


class FakeEvaluator:
    def __init__(self, serving, candidate):
        self.outcomes, self.calls = (tuple(serving), tuple(candidate)), []

    def __call__(self, candidate, serving):
        self.calls.append((candidate.policy_version, serving.policy_version if serving else None))
        return PairedOutcomes(
            serving.policy_version if serving else "base", *self.outcomes, {"serving_greedy_rate": 1.0}
        )


def _saved(event: PolicyUpdated) -> dict:
    return json.loads((Path(event.checkpoint_path) / "state.json").read_text())


def test_check_refuses_a_worse_version_and_saves_the_decision_first(tmp_path):
    state, event = _checkpointed(tmp_path)
    serving = _update("v1", tmp_path / "checkpoints", gate="accepted")
    evaluator = FakeEvaluator([True] * 8, [False] * 8)
    gated = Gate(evaluator, lambda: serving, 0.05).check(event, state)
    assert evaluator.calls == [("v2", "v1")]
    assert gated.gate == "refused" and gated.event_id == event.event_id
    assert gated.gate_figures["serving_version"] == 1.0 and gated.gate_figures["worse"] == 8.0
    assert gated.gate_figures["serving_greedy_rate"] == 1.0  # the evaluator's extra figures kept
    saved = _saved(gated)
    assert saved["last_event"]["gate"] == "refused" and saved["step"] == 3
    assert state.last_event["gate"] == "refused"
    # gating again (a restart after the save) does not evaluate again and keeps the decision
    assert Gate(evaluator, lambda: serving).check(gated, state) == gated
    assert len(evaluator.calls) == 1


def test_check_accepts_against_the_base_when_nothing_serves(tmp_path):
    state, event = _checkpointed(tmp_path, "v1")
    gated = Gate(FakeEvaluator([False] * 4, [True] * 4), lambda: None).check(event, state)
    assert gated.gate == "accepted" and gated.gate_figures["serving_version"] == 0.0
    assert _saved(gated)["last_event"]["gate"] == "accepted"


def test_an_evaluation_failure_is_not_dead_lettered_and_saves_nothing(tmp_path):
    state, event = _checkpointed(tmp_path)

    def broken(candidate, serving):
        raise FileNotFoundError("adapter_model.safetensors")

    with pytest.raises(GateUnavailable, match="v2: could not evaluate it against base") as caught:
        Gate(broken, lambda: None).check(event, state)
    assert refusal(caught.value, "cannot train") is None  # the loop re-raises it: the process exits
    assert _saved(event)["last_event"]["gate"] == ""


def test_check_refuses_to_save_a_decision_for_another_version(tmp_path):
    state, event = _checkpointed(tmp_path)
    state.policy_version = "v3"
    with pytest.raises(TrainerError, match="'v3'"):
        Gate(FakeEvaluator([True], [True]), lambda: None).check(event, state)


# --- the follower's seams --------------------------------------------------------------------------


class FakeProducer:
    def __init__(self, on_send=None):
        self.sent, self.on_send = [], on_send

    def send(self, topic, key, value):
        self.sent.append(value)
        if self.on_send:
            self.on_send(value)
        return self

    def get(self, timeout):
        return None


class FakeExecutor:
    def __init__(self, state: TrainState, event: PolicyUpdated):
        self.state, self.event, self.trained = state, event, []

    def train_batch(self, rows, method, batch_id, source_ranges=None):
        self.trained.append(batch_id)
        return self.event


def test_train_event_publishes_the_gated_event_after_saving_it(tmp_path, monkeypatch):
    state, event = _checkpointed(tmp_path)
    state.batches = []
    monkeypatch.setattr(follow, "read_rows", lambda path: [{"messages": []}])
    seen_at_send, executor = [], RestoringExecutor(state, event)
    producer = FakeProducer(
        lambda value: seen_at_send.append((_saved(event)["last_event"]["gate"], list(executor.restored)))
    )
    gate = Gate(FakeEvaluator([True] * 6, [False] * 6), lambda: None)
    batch = BatchBuilt(
        event_id="bb", trajectory_id="b1", batch_id="b1", kind="sft", path="/x", row_count=1,
        occurred_at=utc_now(), producer="test",
    )  # fmt: skip
    follow._train_event(executor, producer, Record("t", 0, 0, None, encode(batch)), ("sft",), gate)
    assert [json.loads(v)["gate"] for v in producer.sent] == ["refused"]
    # on disk, and the executor back on the serving weights (the base here), before it was sent
    assert seen_at_send == [("refused", [("base", "refused")])]


def test_publish_unpublished_gates_a_version_checkpointed_before_its_decision(tmp_path, monkeypatch):
    state, _ = _checkpointed(tmp_path)
    monkeypatch.setattr(follow, "_policy_updates", lambda bootstrap: [])
    gate = Gate(FakeEvaluator([True] * 6, [True] * 6), lambda: None)
    producer = FakeProducer()
    assert follow.publish_unpublished("b", producer, state.last_event, lambda e: gate.check(e, state))
    assert [json.loads(v)["gate"] for v in producer.sent] == ["accepted"]
    # already on the topic: neither gated nor published again
    monkeypatch.setattr(follow, "_policy_updates", lambda bootstrap: [{"event_id": "pu-v2"}])

    def never(e):
        raise AssertionError("gated a published version")

    assert not follow.publish_unpublished("b", FakeProducer(), state.last_event, never)


# --- readers: current policy, sink row, lineage, config ---------------------------------------------


def test_the_current_policy_never_is_a_refused_version():
    reader = CurrentPolicyReader("unused:9092")
    for offset, (version, gate) in enumerate(
        (("v1", "accepted"), ("v2", ""), ("v3", "refused"), ("v4", "refused"))
    ):
        event = _update(version, Path("/c"), gate=gate, step=offset)
        reader._fold(Record("policy.updates", 0, offset, None, encode(event)))
    assert reader._current.policy_version == "v2"  # '' (no gate ran) is served, refused never
    reader._fold(Record("policy.updates", 0, 9, None, encode(_update("v5", Path("/c"), gate="accepted"))))
    assert reader._current.policy_version == "v5"


def test_the_sink_row_carries_the_gate_and_its_figures():
    event = _update("v3", Path("/c"), gate="refused", gate_figures={"p_worse": 0.01, "worse": 7.0})
    row = dict(zip(COLUMNS["policy_versions"], policy_version_row(event), strict=True))
    assert row["gate"] == "refused" and row["gate_figures"] == {"p_worse": 0.01, "worse": 7.0}


def test_lineage_shows_a_refused_version_with_its_figures():
    version = {
        "policy_version": "v3", "previous_version": "v2", "method": "sft", "step": 4,
        "checkpoint_path": "/c/v3", "metrics": {"loss": 1.0}, "staleness_histogram": {},
        "dropped_groups": 0, "behaviour_versions": [], "source_ranges": {}, "batch_ids": [],
        "gate": "refused", "gate_figures": {"serving_version": 1.0, "p_worse": 0.0078125, "worse": 7.0},
    }  # fmt: skip
    text = format_lineage({"version": version, "batches": [], "trajectories": [], "steps": [],
                           "steps_by_policy_version": {}})  # fmt: skip
    assert "gate: REFUSED (never served) against v1: p_worse=0.007812, serving_version=1, worse=7" in text
    assert gate_line({**version, "gate": "accepted"}).startswith("gate: accepted against v1")
    assert gate_line({**version, "gate": ""}) == "gate: - (no gate ran)"


def test_gate_options_are_checked():
    with pytest.raises(ConsumerConfigError, match="--gate-tasks"):
        TrainRunConfig(follow=True, gate=True)
    with pytest.raises(ConsumerConfigError, match=re.escape("--gate-alpha: must be in (0, 1), got 0.0")):
        TrainRunConfig(follow=True, gate=True, gate_tasks=Path("t.jsonl"), gate_alpha=0.0)
    with pytest.raises(ConsumerConfigError, match="--gate-samples: must be >= 1, got 0"):
        TrainRunConfig(follow=True, gate_samples=0)
    assert TrainRunConfig(follow=True).gate is False


# --- a refused version is rolled back: the executor goes on from the serving version's weights ---------


def test_restore_target_is_the_version_the_refused_one_was_compared_with():
    refused = _update("v3", Path("/c"), gate="refused", gate_figures={"serving_version": 1.0})
    event = refused.model_dump(mode="json")
    assert restore_target(TrainState(policy_version="v3", last_event=event)) == "v1"
    on_base = {**event, "gate_figures": {"serving_version": 0.0}}
    assert restore_target(TrainState(policy_version="v3", last_event=on_base)) == "base"
    assert restore_target(TrainState(policy_version="v1", last_event=event)) is None  # rolled back already
    accepted = {**event, "gate": "accepted"}
    assert restore_target(TrainState(policy_version="v3", last_event=accepted)) is None
    unnumbered = {**event, "gate_figures": {"serving_version": -1.0}}
    with pytest.raises(TrainerError, match=re.escape("serving_version -1.0")):
        restore_target(TrainState(policy_version="v3", last_event=unnumbered))


def test_roll_back_points_latest_at_the_serving_checkpoint_and_keeps_the_counters(tmp_path):
    root = tmp_path / "checkpoints"
    for version, step in (("v1", 4), ("v2", 9)):
        (root / version / "adapter").mkdir(parents=True)
        (root / version / "optimizer.pt").write_bytes(b"x")
        state = TrainState(step=step, policy_version=version, versions=int(version[1:]))
        (root / version / "state.json").write_text(json.dumps(asdict(state)))
    refused = _update("v2", root, gate="refused", gate_figures={"serving_version": 1.0}).model_dump(
        mode="json"
    )
    state = TrainState(9, "v2", ["b1", "b2"], refused, 2, 0)
    (root / "v2" / "state.json").write_text(json.dumps(asdict(state)))
    (root / "latest").write_text("v2")
    v2_state = (root / "v2" / "state.json").read_text()
    assert checkpoints.roll_back_refused(root) == "v1"
    assert (root / "latest").read_text() == "v1"
    rolled = checkpoints.read_state(root / "v1")
    assert (rolled.policy_version, rolled.step, rolled.versions, rolled.batches) == ("v1", 4, 2, ["b1", "b2"])
    assert rolled.last_event["policy_version"] == "v2"  # so a restart still publishes v2 if it was not
    assert (root / "v2" / "state.json").read_text() == v2_state  # the refused checkpoint is left as it was
    assert checkpoints.roll_back_refused(root) is None  # done: a restart does not roll back again
    assert rolled.next_version("b3") == "v1" and rolled.policy_version == "v3"  # numbered on, from v1
    # back to the base: a state.json without weights, named by latest
    base = checkpoints.roll_back(root, state, "base")
    assert (root / "latest").read_text() == "base" and base.policy_version is None and base.step == 0
    assert checkpoints.read_state(root / "base").versions == 2
    (root / "v1" / "optimizer.pt").unlink()
    with pytest.raises(TrainerError, match="not a complete checkpoint of 'v1'"):
        checkpoints.roll_back(root, state, "v1")


class RestoringExecutor(FakeExecutor):
    def __init__(self, state, event, fail: Exception | None = None):
        super().__init__(state, event)
        self.restored, self.fail = [], fail

    def restore(self, version):
        self.restored.append((version, _saved(self.event)["last_event"]["gate"]))
        if self.fail is not None:
            raise self.fail


def test_settle_restores_the_serving_version_after_saving_the_refusal(tmp_path):
    state, event = _checkpointed(tmp_path)
    serving = _update("v1", tmp_path / "checkpoints", gate="accepted")
    executor = RestoringExecutor(state, event)
    gated = Gate(FakeEvaluator([True] * 8, [False] * 8), lambda: serving).settle(event, executor)
    assert gated.gate == "refused" and executor.restored == [("v1", "refused")]
    state, event = _checkpointed(tmp_path / "ok")
    executor = RestoringExecutor(state, event)
    assert (
        Gate(FakeEvaluator([True] * 8, [True] * 8), lambda: serving).settle(event, executor).gate
        == "accepted"
    )
    assert executor.restored == []
    state, event = _checkpointed(tmp_path / "broken")
    executor = RestoringExecutor(state, event, fail=FileNotFoundError("adapter"))
    with pytest.raises(GateUnavailable, match="could not go back") as caught:
        Gate(FakeEvaluator([True] * 8, [False] * 8), lambda: None).settle(event, executor)
    assert refusal(caught.value, "cannot train") is None  # not dead-lettered: the executor stops


def test_every_rank_of_a_group_restores_when_rank_0_does(monkeypatch):
    sent, items = [], [{"kind": "restore", "version": "v1"}, {"kind": "stop"}]

    def broadcast(ranks, obj):
        if ranks.is_main:
            sent.append(obj)
            return obj
        return items.pop(0)

    monkeypatch.setattr(group_work, "broadcast_object", broadcast)
    events = []

    class Restoring:
        state = TrainState()

        def __init__(self, name):
            self.name = name

        def restore(self, version):
            events.append((self.name, version, list(sent)))

    group_work.LeadExecutor(Restoring("rank0"), Ranks(0, 2, 0)).restore("v1")
    assert events == [("rank0", "v1", [{"kind": "restore", "version": "v1"}])]  # the others told first
    assert group_work.follow_lead(Restoring("rank1"), Ranks(1, 2, 1)) == 0
    assert events[1][:2] == ("rank1", "v1")


# --- the real executor (tiny model, LoRA, CPU) ----------------------------------------------------------


def _data_dir(model_dir: Path, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "models").symlink_to(model_dir / "models")
    return path


def _trainable(executor) -> dict:
    return {n: p.detach().clone() for n, p in executor.model.named_parameters() if p.requires_grad}


def _adapter(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(checkpoint / "adapter" / "adapter_model.safetensors")


def _same(trainable: dict, adapter: dict) -> bool:
    """The executor's LoRA weights equal a saved adapter's (peft drops `.default` from the names)."""
    import torch

    by_name = {n.replace(".default", ""): v for n, v in trainable.items()}
    assert set(by_name) == set(adapter), sorted(set(by_name) ^ set(adapter))[:4]
    return all(torch.equal(by_name[n], adapter[n]) for n in adapter)


ROWS = [{"messages": demonstration("2 + 3"), "tools": TOOLS}]
LORA = TrainConfig(learning_rate=5e-2, micro_batch_size=1, lr_schedule="constant", device="cpu")


def test_the_executor_goes_on_from_the_serving_weights_at_once_and_after_a_restart(model_dir, tmp_path):
    data_dir = _data_dir(model_dir, tmp_path / "data")
    root = data_dir / "checkpoints"
    executor = TrainingExecutor(LORA, data_dir)
    v1 = Gate(FakeEvaluator([False] * 4, [True] * 4), lambda: None).settle(
        executor.train_batch(ROWS, "sft", "b1"), executor
    )
    refuse = Gate(FakeEvaluator([True] * 6, [False] * 6), lambda: v1)
    v2 = refuse.settle(executor.train_batch(ROWS, "sft", "b2"), executor)
    assert (v1.gate, v2.gate) == ("accepted", "refused")
    assert _same(_trainable(executor), _adapter(root / "v1"))  # the serving weights, before v3's update
    assert not _same(_trainable(executor), _adapter(root / "v2"))  # not the refused ones
    assert (root / "latest").read_text() == "v1"
    assert (executor.state.policy_version, executor.state.versions) == ("v1", 2)
    assert json.loads((root / "v2" / "state.json").read_text())["last_event"]["gate"] == "refused"
    v3 = executor.train_batch(ROWS, "sft", "b3")
    assert (v3.policy_version, v3.previous_version, v3.step) == ("v3", "v1", v1.step + 1)

    # v3 refused too, and the process killed right after the decision was saved (no roll-back yet)
    refuse.check(v3, executor.state)
    assert (root / "latest").read_text() == "v3"
    restarted = TrainingExecutor(LORA, data_dir)
    assert (root / "latest").read_text() == "v1" and restarted.state.policy_version == "v1"
    assert (
        restarted.state.batches == ["b1", "b2", "b3"] and restarted.state.last_event["policy_version"] == "v3"
    )
    assert _same(_trainable(restarted), _adapter(root / "v1"))
    assert not _same(_trainable(restarted), _adapter(root / "v3"))
    assert restarted.optimizer.state_dict()["state"], "v1's optimizer state"
    assert restarted.train_batch(ROWS, "sft", "b4").previous_version == "v1"


def test_a_version_refused_against_the_base_goes_back_to_a_fresh_adapter(model_dir, tmp_path):
    import torch

    data_dir = _data_dir(model_dir, tmp_path / "data")
    fresh = _trainable(TrainingExecutor(LORA, _data_dir(model_dir, tmp_path / "fresh")))
    executor = TrainingExecutor(LORA, data_dir)
    v1 = Gate(FakeEvaluator([True] * 6, [False] * 6), lambda: None).settle(
        executor.train_batch(ROWS, "sft", "b1"), executor
    )
    assert v1.gate == "refused" and (data_dir / "checkpoints" / "latest").read_text() == "base"
    after = _trainable(executor)
    assert all(torch.equal(after[n], fresh[n]) for n in fresh)  # the adapter as it was at the start
    assert not executor.optimizer.state_dict()["state"]  # a fresh optimizer
    assert executor.state.policy_version is None and executor.state.step == 0
    v2 = executor.train_batch(ROWS, "sft", "b2")
    assert (v2.policy_version, v2.previous_version, v2.step) == ("v2", None, 1)
    restarted = TrainingExecutor(LORA, data_dir)  # latest: v2 (ungated), resumed as usual
    assert restarted.state.policy_version == "v2"
    assert _same(_trainable(restarted), _adapter(data_dir / "checkpoints" / "v2"))
