"""The loop on a real vLLM: `up --policy --train` with the policy server as a recording proxy in front
of vLLM (`--upstream`). Rollouts through the proxy are recorded with vLLM's token ids and logprobs,
the batch builder makes GRPO rows from those ids, the executor trains LoRA versions, the proxy loads
each into vLLM and samples on it: steps carry base, then v1, then v2, and the lineage of v2 shows
the events v1 sampled.

The rounds are finite and one group each (one task, group of 4), so each version is trained on
exactly one round: v1 on the base's, v2 on v1's.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from itertools import groupby
from pathlib import Path

import openai
import pytest

from clients.kafka import read_to_end
from consumers.batching.batch_writer import read_rows
from schemas import topics
from schemas.codec import decode
from schemas.events import BatchBuilt, PolicyUpdated
from tests.support.policy import recorded_steps
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for

LOOP_ENV = {  # every component reads its options from the environment; each takes the ones it has
    "AGENTSTREAM_KINDS": "grpo",
    "AGENTSTREAM_GROUP_SIZE": "4",
    "AGENTSTREAM_BATCH_TRAJECTORIES": "4",
    "AGENTSTREAM_FLUSH_INTERVAL_S": "0.5",
}
TRAIN_ARGS = "--learning-rate 1e-3 --micro-batch-size 4 --max-staleness 2"
IGNORE = -100  # the label of an untrained token in a batch row


def _cli(*args: str, timeout_s: float = 300) -> str:
    done = subprocess.run([*AGENTSTREAM, *args], capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _serving(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
        return json.loads(reply.read())["policy_version"]


def _updates(bootstrap: str) -> list[PolicyUpdated]:
    records = read_to_end(bootstrap, [topics.POLICY_UPDATES])
    return [e for r in records if isinstance(e := decode(r.value), PolicyUpdated)]


def _batches(bootstrap: str) -> dict[str, BatchBuilt]:
    records = read_to_end(bootstrap, [topics.TRAINING_BATCHES])
    return {e.batch_id: e for r in records if isinstance(e := decode(r.value), BatchBuilt)}


def _start(tmp_path: Path, data_dir: Path, port: int, vllm) -> Proc:
    args = ["up", "--policy", "--policy-port", str(port), "--train", "--train-args", TRAIN_ARGS,
            "--data-dir", str(data_dir), "--broker-port", str(free_port()), "--no-console"]  # fmt: skip
    # the one base model (server, executor, batch builder): the model vLLM serves
    env = {**LOOP_ENV, "AGENTSTREAM_BASE_MODEL": str(vllm.model_dir), "AGENTSTREAM_POLICY_UPSTREAM": vllm.api}
    up = Proc([*AGENTSTREAM, *args], tmp_path / "up.log", env=env)
    wait_for(lambda: "[up] running:" in up.log_text() or not up.alive(), timeout_s=240, what="the stack")
    assert up.alive(), up.log_text()[-3000:]
    return up


def _round(tmp_path: Path, number: int, port: int, bootstrap: str) -> None:
    """One group of rollouts (one calc task, 4 episodes) through the proxy, to the end."""
    tasks = tmp_path / f"tasks-{number}.jsonl"
    task = {"task_id": f"calc-{number}", "env": "calc", "task": {"expression": f"{number} + {number + 1}"}}
    tasks.write_text(json.dumps(task) + "\n")
    _cli("rollout", "--env", "calc", "--tasks", str(tasks), "--group-size", "4", "--concurrency", "4",
         "--max-turns", "2", "--max-tokens", "12", "--no-forever", "--bootstrap-servers", bootstrap,
         "--policy-url", f"http://127.0.0.1:{port}/v1", "--data-dir", str(tasks.with_suffix("")))  # fmt: skip


def _serves(port: int, vllm, version: str) -> None:
    """The proxy says it serves `version` and vLLM has it loaded under that name."""
    wait_for(lambda: _serving(port) == version, timeout_s=120, what=f"the proxy to serve {version}")
    assert version in vllm.models(), (version, vllm.models())


def _rows_match_recorded(batch: BatchBuilt, steps_by_trajectory: dict[str, list]) -> None:
    """Each GRPO row trains exactly the token ids vLLM sampled, with the logprobs it returned."""
    rows = read_rows(batch.path)
    assert sorted(r["trajectory_id"] for r in rows) == sorted(batch.trajectory_ids)
    for row in rows:
        steps = steps_by_trajectory[row["trajectory_id"]]
        assert all(s.token_continuity != "broken" for s in steps), [s.token_continuity for s in steps]
        trained = [i for i, label in enumerate(row["labels"]) if label != IGNORE]
        assert [row["labels"][i] for i in trained] == [t for s in steps for t in s.token_ids]
        assert [row["behaviour_logprobs"][i] for i in trained] == [x for s in steps for x in s.logprobs]


def _sampled_steps(bootstrap: str, port: int) -> list:
    """Every step the proxy recorded (with vLLM's token ids), after one more sampled by v2, in order."""
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1/episodes/t-v2", api_key="none", max_retries=0)
    api.chat.completions.create(model="policy", messages=[{"role": "user", "content": "2 + 3"}], max_tokens=6)

    def sampled():
        found = [s for s in recorded_steps(bootstrap) if s.token_ids]
        return found if any(s.trajectory_id == "t-v2" for s in found) else None

    steps = wait_for(sampled, timeout_s=60, what="the step sampled by v2")
    return sorted(steps, key=lambda s: s.occurred_at)


def _lineage(data_dir: Path, version: str) -> dict:
    """`agentstream lineage VERSION --json`, once ClickHouse has its step events."""

    def report():
        done = subprocess.run([*AGENTSTREAM, "lineage", version, "--json", "--data-dir", str(data_dir)],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        found = json.loads(done.stdout) if done.returncode == 0 else None
        return found if found and found["steps"] else None

    return wait_for(report, timeout_s=120, interval_s=2, what=f"the lineage of {version} in ClickHouse")


@pytest.mark.timeout(900)
def test_the_loop_closes_on_vllm_versions_are_served_recorded_and_traced(tmp_path, vllm_server):
    data_dir, port = tmp_path / "stack", free_port()
    up = _start(tmp_path, data_dir, port, vllm_server)
    try:
        bootstrap = json.loads((data_dir / "run" / "stack.json").read_text())["bootstrap_servers"]
        assert _serving(port) == "base"
        for number, version in ((1, "v1"), (2, "v2")):  # a round sampled by the newest, trained into the next
            _round(tmp_path, number, port, bootstrap)
            wait_for(lambda n=number: len(_updates(bootstrap)) >= n, timeout_s=300, what=f"{version} trained")
            _serves(port, vllm_server, version)
        steps = _sampled_steps(bootstrap, port)
        updates = _updates(bootstrap)
        assert [(u.policy_version, u.previous_version) for u in updates[:2]] == [("v1", None), ("v2", "v1")]
        assert updates[0].behaviour_versions == ["base"] and updates[1].behaviour_versions == ["v1"]

        # sampled in order by the base, then v1, then v2, each step with vLLM's ids and logprobs
        assert [v for v, _ in groupby(s.policy_version for s in steps)] == ["base", "v1", "v2"]
        assert all(len(s.token_ids) == len(s.logprobs) > 0 for s in steps)
        by_v1 = [s for s in steps if s.policy_version == "v1"]
        assert {s.trajectory_id for s in by_v1} == set(updates[1].trajectory_ids)

        # each version trained one GRPO batch, built from exactly the recorded token ids and logprobs
        by_trajectory: dict[str, list] = {}
        for step in sorted(steps, key=lambda s: (s.trajectory_id, s.step_index)):
            by_trajectory.setdefault(step.trajectory_id, []).append(step)
        batches = _batches(bootstrap)
        for update in updates[:2]:
            assert len(update.batch_ids) == 1, update.batch_ids
            _rows_match_recorded(batches[update.batch_ids[0]], by_trajectory)

        # lineage: v2's parent is v1, and the step events that trained it are the ones v1 sampled
        report = _lineage(data_dir, "v2")
        assert report["version"]["previous_version"] == "v1"
        assert report["steps_by_policy_version"] == {"v1": len(by_v1)}
        assert {s["event_id"] for s in report["steps"]} == {s.event_id for s in by_v1}
    finally:
        up.stop()
