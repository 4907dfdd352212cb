"""`agentstream annotate` and `agentstream calibrate` as subprocesses against the embedded broker."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from clients.kafka import ensure_topics
from schemas.events import EpisodeStarted, JudgeTrajectory
from schemas.topics import FEEDBACK_HUMAN
from streams.judge.annotations import annotation_event, pair_scores
from streams.judge.calibration import CalibrationMap
from streams.judge.human import publish, read_events
from tests.support.processes import AGENTSTREAM, wait_for

T0 = "2026-11-21T10:00:00Z"


def _cli(*args, bootstrap):
    return subprocess.run(
        [*AGENTSTREAM, *args, "--bootstrap-servers", bootstrap], capture_output=True, text=True, timeout=120
    )


def test_pairs_match_labels_to_judge_scores_per_domain_and_rubric():
    events = [
        EpisodeStarted(
            event_id="s", trajectory_id="t", occurred_at=T0, producer="x", task_id="k", domain="coding"
        ),
        JudgeTrajectory(
            event_id="j", trajectory_id="t", occurred_at=T0, producer="judge", judge_model="m",
            prompt_version="v", scores={"goal_progress": 0.2}, score=0.3,
        ),
        annotation_event("t", "overall", 0.5, annotator="a"),
        annotation_event("t", "overall", 0.7, annotator="b"),
        annotation_event("t", "goal_progress", 0.4),
        annotation_event("t", "tool_choice", 0.4),  # the judge did not score it: unmatched, not guessed
        annotation_event("unknown", "overall", 0.4),
    ]  # fmt: skip
    pairs = pair_scores(events)
    assert pairs.by_key == {("coding", "overall"): [(0.3, 0.6)], ("coding", "goal_progress"): [(0.2, 0.4)]}
    assert pairs.unmatched == 2


def _harsh_judge_data(bootstrap: str, tmp_path):
    """60 judged trajectories (judge = human ** 2.5) published; their labels written as JSONL, plus
    one bad row."""
    ensure_topics(bootstrap)
    rng = random.Random(3)
    judged, labels = [], []
    for n in range(60):
        tid = f"cal-{n}"
        human = rng.random()
        auto = human**2.5  # a harsh judge
        judged.append(
            EpisodeStarted(event_id=f"s{n}", trajectory_id=tid, occurred_at=T0, producer="t", task_id="k",
                           domain="coding")
        )  # fmt: skip
        judged.append(
            JudgeTrajectory(event_id=f"j{n}", trajectory_id=tid, occurred_at=T0, producer="judge",
                            judge_model="m", prompt_version="v", scores={}, score=round(auto, 6))
        )  # fmt: skip
        labels.append({"trajectory_id": tid, "score": round(human, 6), "annotator": "ann"})
    publish(bootstrap, judged)
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in labels) + '\n{"trajectory_id": "x", "score": 3}\n')
    return path


@pytest.mark.integration
def test_annotate_import_and_calibrate_publish_a_map_that_undoes_the_distortion(broker, tmp_path):
    path = _harsh_judge_data(broker.bootstrap, tmp_path)
    done = _cli("annotate", "--import", str(path), bootstrap=broker.bootstrap)
    assert done.returncode == 1, done.stderr  # one bad row: reported, the rest published
    assert "published 60 annotation(s)" in done.stdout and "labels.jsonl:61" in done.stdout
    again = _cli("annotate", "--trajectory", "cal-0", "--step", "2", "--rubric", "tool_choice",
                 "--score", "0.9", "--annotator", "me", bootstrap=broker.bootstrap)  # fmt: skip
    assert again.returncode == 0, again.stderr

    png = tmp_path / "reliability.png"
    done = _cli("calibrate", "--publish", "--plot", str(png), "--min-pairs", "20", bootstrap=broker.bootstrap)
    assert done.returncode == 0, done.stderr
    assert "coding" in done.stdout and "published 1 calibration map(s)" in done.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"

    maps = [e for e in read_events(broker.bootstrap, [FEEDBACK_HUMAN]) if e.type == "calibration.updated"]
    (event,) = maps
    assert (event.domain, event.rubric, event.n) == ("coding", "overall", 60)
    assert event.metrics["calibrated_mae"] < event.metrics["mae"] / 3
    cmap = CalibrationMap.from_event(event)
    assert cmap.apply(0.5**2.5) == pytest.approx(0.5, abs=0.06)
    labels_on_topic = [
        e for e in read_events(broker.bootstrap, [FEEDBACK_HUMAN]) if e.type == "feedback.annotation"
    ]
    assert len(labels_on_topic) == 61


@pytest.mark.integration
def test_calibrate_from_clickhouse_gives_the_same_map(broker, clickhouse_url, tmp_path):
    from tests.support.sink_harness import reader, scalar, start_sink

    path = _harsh_judge_data(broker.bootstrap, tmp_path)
    assert _cli("annotate", "--import", str(path), bootstrap=broker.bootstrap).returncode == 1
    from_topics = _cli("calibrate", "--min-pairs", "20", bootstrap=broker.bootstrap)
    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        client = reader(clickhouse_url)
        wait_for(
            lambda: scalar(client, "SELECT count() FROM agentstream.annotations") >= 60, 90, what="labels"
        )
        wait_for(
            lambda: scalar(client, "SELECT count() FROM agentstream.judge_scores") >= 60, 90, what="scores"
        )
        from_ch = _cli("calibrate", "--source", "clickhouse", "--clickhouse-url", clickhouse_url,
                       "--min-pairs", "20", bootstrap=broker.bootstrap)  # fmt: skip
    finally:
        sink.proc.stop()
    assert from_ch.returncode == 0, from_ch.stderr
    version = next(w for w in from_topics.stdout.split() if w.startswith("cal-"))
    assert version in from_ch.stdout and "| coding" in from_ch.stdout
