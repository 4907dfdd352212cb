"""Fault tests of the whole system: during load, kill -9 each component in turn (broker, each role, sink,
batch builder, gateway); the supervisor restarts it. Afterwards every acknowledged step is in ClickHouse
exactly once (deduplicated views), every ended episode has one current `trajectory.scored`, and no
trajectory is in two batches of the same kind.

Everything is real: `agentstream up`'s supervisor runs the processes, the SDK and HTTP clients produce.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.bench import scripted
from infra.stack import StackSupervisor, embedded_config
from schemas import EpisodeEnded, EpisodeStarted, StepRecorded, derived_event_id, encode, utc_now
from tests.support.processes import free_port, wait_for

API_KEY = "fault-test-key"
KILL_ORDER = ("broker", "scoring", "sink", "batch", "gateway")  # scoring: the rules + the assembler


class Stack:
    def __init__(self, data_dir: Path):
        self.gateway_port = free_port()
        self.config = embedded_config(
            data_dir,
            gateway=True,
            gateway_port=self.gateway_port,
            extra_env={"AGENTSTREAM_GATEWAY_API_KEY_HASHES": hashlib.sha256(API_KEY.encode()).hexdigest()},
        )
        self.events: list[str] = []
        self.supervisor = StackSupervisor(self.config, on_event=self.events.append)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self):
        self.supervisor.start()
        self._poller.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._poller.join()
        self.supervisor.stop()

    def _poll(self):
        while not self._stop.is_set():
            self.supervisor.poll()
            time.sleep(0.2)

    def kill9(self, name: str) -> None:
        import os
        import signal

        entry = self.supervisor.running[name]

        # It may itself be between a crash and its restart (a worker exits when the broker it
        # was writing to dies): wait until it runs, then kill that process.
        def running_popen():
            popen = entry.popen  # read once: the supervisor's poller thread replaces it
            return popen if popen is not None and popen.poll() is None else None

        old_pid = wait_for(running_popen, timeout_s=60, what=f"{name} to be running before the kill").pid
        os.killpg(old_pid, signal.SIGKILL)
        wait_for(
            lambda: entry.popen is not None and entry.popen.pid != old_pid and entry.popen.poll() is None,
            timeout_s=60,
            what=f"{name} to be restarted",
        )

    def query(self, sql: str) -> list[tuple]:
        return self.config.query(sql)


class SdkLoad(threading.Thread):
    """Scripted agents in the product's envs through the SDK until stopped; remembers what it recorded."""

    def __init__(self, stack: Stack):
        super().__init__(daemon=True)
        from producers.sdk.recorder import AgentRecorder

        self.recorder = AgentRecorder(
            bootstrap_servers=stack.config.bootstrap_servers,
            data_dir=stack.config.data_dir / "sdk",
            agent="scripted-agent",
            model="scripted-medium",
        )
        self.stop_event = threading.Event()
        self.steps = 0
        self.episodes = 0
        self.error: BaseException | None = None

    def run(self):
        try:
            round_ = 0
            while not self.stop_event.is_set():
                for task in scripted.tasks(3):
                    tid = f"sdk-{round_}-{task.task_id}"
                    policy = scripted.POLICIES[round_ % 3]
                    played = scripted.play(self.recorder, task, policy, round_, tid, tid)
                    self.steps += played.steps
                    self.episodes += 1
                round_ += 1
                time.sleep(0.05)
        except BaseException as exc:  # reported by the test
            self.error = exc


class GatewayLoad(threading.Thread):
    """Whole episodes over HTTP; a request is retried (same event ids) until the gateway answers 202."""

    def __init__(self, stack: Stack):
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{stack.gateway_port}/v1/events"
        self.stop_event = threading.Event()
        self.steps = 0
        self.episodes = 0

    def run(self):
        i = 0
        while not self.stop_event.is_set():
            events = _http_episode(f"http-{i}", steps=3)
            self._post_until_accepted(events)
            self.steps += 3
            self.episodes += 1
            i += 1
            time.sleep(0.05)

    def _post_until_accepted(self, events: list) -> None:
        body = b"[" + b",".join(encode(e) for e in events) + b"]"
        while True:
            request = urllib.request.Request(
                self.url,
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    if response.status == 202:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.2)


def _http_episode(trajectory_id: str, steps: int) -> list:
    def envelope(kind: str, *parts) -> dict:
        return {
            "event_id": derived_event_id(kind, trajectory_id, *parts),
            "trajectory_id": trajectory_id,
            "occurred_at": utc_now(),
            "producer": "fault-test-http",
        }

    out = [EpisodeStarted(**envelope("episode.started"), task_id="http-task", domain="generic", group_id="h")]
    for i in range(steps):
        out.append(
            StepRecorded(
                **envelope("step.recorded", i),
                step_index=i,
                tool="search",
                params={"q": f"item {i}"},
                observation=f"result {i}",
            )
        )
    out.append(EpisodeEnded(**envelope("episode.ended"), success=True, score=1.0))
    return out


@dataclass
class FaultRun:
    stack: Stack
    expected_steps: int
    expected_episodes: int


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    """One run for the whole module: load, kill -9 every component in turn, wait for catch-up."""
    with Stack(tmp_path_factory.mktemp("faults") / "stack") as stack:
        sdk, http = SdkLoad(stack), GatewayLoad(stack)
        sdk.start()
        http.start()
        for name in KILL_ORDER:
            time.sleep(3)
            stack.kill9(name)
        time.sleep(3)
        sdk.stop_event.set()
        http.stop_event.set()
        sdk.join(60)
        http.join(120)
        assert sdk.error is None, sdk.error
        assert sdk.recorder.flush(timeout=120), "the SDK could not deliver everything it recorded"
        sdk.recorder.close()
        run = FaultRun(stack, sdk.steps + http.steps, sdk.episodes + http.episodes)
        assert run.expected_episodes > 20, "the load produced too little to prove anything"

        def caught_up():
            steps = stack.query("SELECT count() FROM agentstream.steps FINAL")[0][0]
            episodes = stack.query("SELECT uniqExact(trajectory_id) FROM agentstream.trajectories FINAL")[0][
                0
            ]
            return steps >= run.expected_steps and episodes >= run.expected_episodes

        wait_for(caught_up, timeout_s=180, interval_s=1, what="ClickHouse to catch up after the faults")
        yield run


pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_every_component_was_killed_and_restarted(faulted):
    restarted = {name for name in KILL_ORDER if faulted.stack.supervisor.running[name].restarts >= 1}
    assert restarted == set(KILL_ORDER), faulted.stack.events


def test_every_acknowledged_step_is_in_clickhouse_exactly_once(faulted):
    total, distinct = faulted.stack.query("SELECT count(), uniqExact(event_id) FROM agentstream.steps FINAL")[
        0
    ]
    assert total == distinct == faulted.expected_steps


def test_one_current_trajectory_per_ended_episode(faulted):
    episodes = faulted.stack.query("SELECT uniqExact(trajectory_id) FROM agentstream.trajectories FINAL")[0][
        0
    ]
    assert episodes == faulted.expected_episodes
    doubles = faulted.stack.query(
        "SELECT trajectory_id, count() AS n FROM agentstream.trajectories FINAL "
        "GROUP BY trajectory_id HAVING n > 1"
    )
    assert doubles == []


def test_no_trajectory_is_in_two_batches_of_one_kind(faulted):
    batched = _batched_trajectories(faulted.stack.config.data_dir / "batches")
    assert batched, "the trainer built batches during the run"
    for kind, ids in batched.items():
        duplicates = [tid for tid, n in Counter(ids).items() if n > 1]
        assert duplicates == [], f"{kind}: trajectories in more than one batch: {duplicates[:5]}"


def test_every_step_has_one_rule_reward_and_every_trajectory_is_complete(faulted):
    rewards = faulted.stack.query(
        "SELECT count(), uniqExact(source_event_id) FROM agentstream.rule_rewards FINAL"
    )
    assert rewards[0][0] == rewards[0][1] == faulted.expected_steps
    incomplete = faulted.stack.query(
        "SELECT trajectory_id, missing, revision FROM agentstream.trajectories FINAL WHERE NOT complete"
    )
    assert incomplete == []


def _batched_trajectories(root: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for manifest in root.glob("*/*.manifest.json"):
        data = json.loads(manifest.read_text())
        out.setdefault(data["kind"], []).extend(data["trajectory_ids"])
    return out
