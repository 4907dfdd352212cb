"""Calibration: agreement metrics against known values and an isotonic map that undoes a known
monotone distortion of the judge's scores."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.codec import decode, encode
from schemas.events import CalibrationUpdated
from streams.judge.calibration import (
    CalibrationMap,
    agreement_metrics,
    fit_calibration,
    fit_isotonic,
    kendall_tau_b,
    pairwise_agreement,
    pearson,
    reliability_plot,
    report_rows,
    spearman,
)


def test_metrics_match_the_seed_worked_example():
    auto, human = [0.1, 0.5, 0.9, 0.7], [0.2, 0.4, 1.0, 0.9]
    assert pearson(auto, human) == pytest.approx(0.9475, abs=1e-4)
    assert spearman(auto, human) == pytest.approx(1.0)
    assert kendall_tau_b(auto, human) == pytest.approx(1.0)
    assert pairwise_agreement(auto, human) == pytest.approx(1.0)
    assert agreement_metrics(auto, human)["mae"] == pytest.approx(0.125)


def test_metrics_against_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(7)
    auto = [round(rng.random(), 1) for _ in range(40)]  # rounded: ties on purpose
    human = [min(1.0, max(0.0, a + rng.gauss(0, 0.2))) for a in auto]
    assert pearson(auto, human) == pytest.approx(scipy_stats.pearsonr(auto, human)[0])
    assert spearman(auto, human) == pytest.approx(scipy_stats.spearmanr(auto, human)[0])
    assert kendall_tau_b(auto, human) == pytest.approx(scipy_stats.kendalltau(auto, human)[0])


def test_constant_scores_have_no_correlation_rather_than_zero():
    import math

    assert math.isnan(pearson([0.5, 0.5, 0.5], [0.1, 0.2, 0.3]))


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=40))
def test_isotonic_fit_is_monotone_and_no_worse_than_the_mean(pairs):
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    fit = fit_isotonic(xs, ys)
    assert all(b >= a - 1e-12 for a, b in zip(fit.ys, fit.ys[1:], strict=False))
    assert fit.xs == sorted(set(xs))
    cmap = CalibrationMap(version="v", xs=fit.xs, ys=[min(1, max(0, y)) for y in fit.ys])
    sse_fit = sum((cmap.apply(x) - y) ** 2 for x, y in pairs)
    mean = sum(ys) / len(ys)
    assert sse_fit <= sum((y - mean) ** 2 for y in ys) + 1e-9


def test_calibration_recovers_a_known_monotone_distortion():
    rng = random.Random(42)

    def sample(n):
        human = [rng.random() for _ in range(n)]
        auto = [min(1.0, max(0.0, h**2.5 + rng.gauss(0, 0.02))) for h in human]  # the judge is harsh
        return auto, human

    auto, human = sample(400)
    result = fit_calibration(auto, human, domain="coding", rubric="goal_progress")
    assert result.after["mae"] < result.before["mae"] / 3
    # on fresh data from the same judge, the map still closes most of the gap
    auto2, human2 = sample(200)
    calibrated = [result.map.apply(a) for a in auto2]
    before = sum(abs(a - h) for a, h in zip(auto2, human2, strict=True)) / 200
    after = sum(abs(c - h) for c, h in zip(calibrated, human2, strict=True)) / 200
    assert after < before / 3 and after < 0.05
    assert result.map.apply(0.5**2.5) == pytest.approx(0.5, abs=0.05)
    # ranking is preserved by a monotone map
    assert result.after["spearman"] == pytest.approx(result.before["spearman"], abs=0.02)
    assert (
        result.map.version
        == fit_calibration(auto, human, domain="coding", rubric="goal_progress").map.version
    )


def test_map_is_published_as_an_event_and_applies_after_a_round_trip(tmp_path):
    result = fit_calibration([0.1, 0.2, 0.6, 0.9], [0.3, 0.5, 0.7, 1.0])
    event = CalibrationUpdated(
        event_id="e", trajectory_id="calibration:generic:overall", occurred_at="2026-11-21T00:00:00Z",
        producer="calibrate", version=result.map.version, xs=result.map.xs, ys=result.map.ys,
        metrics=result.metrics, n=result.n,
    )  # fmt: skip
    back = CalibrationMap.from_event(decode(encode(event)))
    assert back.apply(0.4) == pytest.approx(result.map.apply(0.4))
    assert back.apply(0.0) == 0.3 and back.apply(1.0) == 1.0  # clamped outside the data
    rows = report_rows([result])
    assert rows[0]["n"] == 4 and rows[0]["mae_calibrated"] <= rows[0]["mae"]
    png = reliability_plot([result], tmp_path / "rel.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_map_must_be_monotone():
    with pytest.raises(ValueError, match="non-decreasing"):
        CalibrationMap(version="v", xs=[0.0, 1.0], ys=[0.8, 0.2])


def test_assembler_totals_change_with_a_published_calibration_map():
    """The map travels as `calibration.updated` (as `agentstream calibrate --publish` sends it) into the
    streams assembler: a trajectory assembled after it has a calibrated judge layer, a different
    total and the map's version in `calibration_version`."""
    from schemas.events import EpisodeEnded, EpisodeStarted, JudgeTrajectory, RuleRewardStep, StepRecorded
    from schemas.records import Record
    from schemas.topics import topic_for
    from streams.assembler.processor import TrajectoryAssembler
    from streams.judge.calibration import calibration_event
    from streams.rules.profiles import ProfileRegistry

    t0 = "2026-11-21T10:00:00Z"

    def records(tid: str) -> list:
        common = {"trajectory_id": tid, "occurred_at": t0}
        events = [
            EpisodeStarted(event_id=f"{tid}-s", producer="t", task_id="k", domain="coding", **common),
            StepRecorded(event_id=f"{tid}-0", producer="t", step_index=0, tool="bash", **common),
            RuleRewardStep(event_id=f"{tid}-r", producer="rules", step_index=0, score=0.8, reward_version="r",
                           source_event_id=f"{tid}-0", **common),
            JudgeTrajectory(event_id=f"{tid}-j", producer="judge", judge_model="m", prompt_version="v",
                            scores={"goal_progress": 0.3}, score=0.3, **common),
            EpisodeEnded(event_id=f"{tid}-e", producer="t", success=True, total_steps=1, **common),
        ]  # fmt: skip
        return [Record(topic_for(e.type), 0, i, tid.encode(), encode(e)) for i, e in enumerate(events)]

    assembler = TrajectoryAssembler(ProfileRegistry(), 60.0, judge_mode=lambda started: "trajectory")
    state: dict = {}

    def feed(batch):
        result = assembler.process(batch, state.get)
        state.update(result.updates)
        return result.outputs

    (before,) = feed(records("before"))
    fit = fit_calibration([0.1, 0.3, 0.6, 0.9], [0.4, 0.7, 0.8, 1.0], domain="coding", rubric="overall")
    event = calibration_event(fit)
    assert feed([Record(topic_for(event.type), 0, 0, event.trajectory_id.encode(), encode(event))]) == []
    (after,) = feed(records("after"))
    assert before.calibration_version is None and after.calibration_version == fit.map.version
    assert after.total_reward != before.total_reward
    assert after.total_reward > before.total_reward  # the harsh judge's 0.3 maps up to 0.7
