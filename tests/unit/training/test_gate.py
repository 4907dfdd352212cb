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
from consumers.training import follow
from consumers.training.config import TrainRunConfig
from consumers.training.gate import Gate, GateUnavailable, PairedOutcomes, decide, worse_p_value
from consumers.training.versions import TrainState
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
    seen_at_send = []
    producer = FakeProducer(lambda value: seen_at_send.append(_saved(event)["last_event"]["gate"]))
    gate = Gate(FakeEvaluator([True] * 6, [False] * 6), lambda: None)
    batch = BatchBuilt(
        event_id="bb", trajectory_id="b1", batch_id="b1", kind="sft", path="/x", row_count=1,
        occurred_at=utc_now(), producer="test",
    )  # fmt: skip
    follow._train_event(
        FakeExecutor(state, event), producer, Record("t", 0, 0, None, encode(batch)), ("sft",), gate
    )
    assert [json.loads(v)["gate"] for v in producer.sent] == ["refused"]
    assert seen_at_send == ["refused"]  # on disk before it was sent


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
