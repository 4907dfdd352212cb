"""The console (`agentstream console`, a real process on real chDB) says which reward version its
leaderboard and trajectory pages show: the newest complete one, or the one picked in the page."""

from __future__ import annotations

import html
import re
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pytest

from consumers.sink.rows import COLUMNS, rows_for
from producers.reward_versions import completed_event
from schemas.codec import encode
from schemas.events import EpisodeEnded, EpisodeStarted, ScoredStep, TrajectoryScored
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
LIVE, REPLAY = "assembly-1+rules-1", "assembly-1+rules-2"


def _events() -> list:
    def scored(tid: str, version: str, reward: float) -> TrajectoryScored:
        steps = [ScoredStep(step_index=0, rule_score=reward, process_score=reward)]
        return TrajectoryScored(
            event_id=f"{tid}-{version}", trajectory_id=tid, occurred_at=T0, producer="assembler",
            task_id="k", task=f"task {tid}", domain="code", model="m", success=True, steps=steps,
            total_steps=1, total_reward=reward, revision=1, reward_version=version,
        )  # fmt: skip

    out: list = []
    for tid in ("a", "b"):
        out += [
            EpisodeStarted(event_id=f"{tid}-s", trajectory_id=tid, occurred_at=T0, producer="sdk",
                           task_id="k", domain="code", model="m"),
            EpisodeEnded(event_id=f"{tid}-e", trajectory_id=tid, occurred_at=T0, producer="sdk",
                         success=True),
        ]  # fmt: skip
    return [*out, scored("a", LIVE, 0.2), scored("b", LIVE, 0.4)]


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console-versions")
    url = f"chdb://{tmp / 'clickhouse'}"
    ready = tmp / "console.ready"
    proc = Proc(
        [*AGENTSTREAM, "console", "--port", str(free_port()), "--ready-file", str(ready)],
        tmp / "console.log",
        env={
            "AGENTSTREAM_CLICKHOUSE_URL": url,
            "AGENTSTREAM_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",  # nothing listens there
            "AGENTSTREAM_DATA_DIR": str(tmp),
        },
    )
    try:
        wait_for(lambda: ready.exists() or not proc.alive(), timeout_s=60, what="console to listen")
        assert proc.alive(), proc.log_text()
        from clients.clickhouse.client import connect

        client = connect(url, wait_s=10, role="writer")  # seeds rows: readers may not insert
        _insert(client, _events())
        # a replay re-scored `a` under rules-2 after the live rows were written, and completed
        replay = TrajectoryScored.model_validate(
            {**_events()[-2].model_dump(), "event_id": "a-r2", "reward_version": REPLAY, "total_reward": 0.9}
        )
        _insert(client, [replay, completed_event("rules-2", ["rules", "assembler"], {}, T0)])
        client.close()
        yield f"http://{ready.read_text()}"
    finally:
        proc.stop()


def _insert(client, events) -> None:
    for event in events:
        for table, row in rows_for(event, encode(event), "test", 0, 0)[1:]:
            client.insert(f"agentstream.{table}", [list(row)], column_names=list(COLUMNS[table]))


def _get(base: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(base + path, timeout=30) as response:
            return response.status, html.unescape(response.read().decode())
    except urllib.error.HTTPError as error:
        return error.code, html.unescape(error.read().decode())


def _shown(page: str) -> str:
    found = re.search(r'data-testid="reward-version">(.*?)</', page, re.S)
    assert found, page[:2000]
    return " ".join(found.group(1).split())


def test_the_leaderboard_page_names_its_reward_version(console):
    status, page = _get(console, "/leaderboard?by=model")
    assert status == 200
    assert _shown(page).startswith(f"Showing reward version: {REPLAY} (newest complete: replay of rules-2")
    assert re.search(r'data-field="mean_reward">0\.900<', page)  # a: 0.9 under rules-2, b not re-scored
    status, page = _get(console, "/leaderboard?by=model&reward_version=rules-1")
    assert status == 200 and _shown(page) == f"Showing reward version: {LIVE} (--reward-version)"
    assert re.search(r'data-field="mean_reward">0\.300<', page) and "--reward-version rules-1" in page
    assert f"<option selected>{LIVE}</option>" in page
    status, page = _get(console, "/leaderboard?reward_version=rules-9")
    assert status == 400 and "reward_version='rules-9': no trajectories under it" in page


def test_the_trajectory_pages_name_their_reward_version(console):
    status, page = _get(console, "/trajectories")
    assert status == 200 and _shown(page).startswith(f"Showing reward version: {REPLAY}")
    assert 'data-trajectory-id="a"' in page and 'data-trajectory-id="b"' not in page
    status, page = _get(console, "/trajectories?reward_version=rules-1")
    assert 'data-trajectory-id="a"' in page and 'data-trajectory-id="b"' in page
    assert f"<option selected>{LIVE}</option>" in page
    status, page = _get(console, "/trajectories/a")
    assert status == 200 and _shown(page).startswith(f"reward version: {REPLAY} (newest complete")
    assert f'href="?reward_version={LIVE.replace("+", "%2B")}"' in page  # the other version, one click away
    status, page = _get(console, "/trajectories/b")  # not re-scored: shown under the live version
    assert _shown(page).startswith(f"reward version: {LIVE} (newest complete: the live version)")
    status, page = _get(console, f"/trajectories/a?reward_version={LIVE.replace('+', '%2B')}")
    assert _shown(page).startswith(f"reward version: {LIVE} (--reward-version)<br>also scored under: <a")
