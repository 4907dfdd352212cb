"""Deterministic scored trajectories for the trainer tests (and the trainer benchmark's shape)."""

from __future__ import annotations

from pathlib import Path

from schemas.events import ScoredStep, TrajectoryScored

HERE = Path(__file__).resolve().parents[1] / "data" / "trainer"  # the golden batches
TOOLS = ("bash", "read_file", "write_file")


def scored(
    trajectory_id: str,
    task_id: str,
    reward: float | None,
    steps: list[dict],
    *,
    success: bool | None = None,
    group_id: str | None = "g0",
    revision: int = 0,
    complete: bool = True,
    policy_version: str | None = "v0",
) -> TrajectoryScored:
    return TrajectoryScored(
        event_id=f"ev-{trajectory_id}-{revision}",
        trajectory_id=trajectory_id,
        occurred_at="2026-01-01T00:00:00Z",
        producer="assembler",
        task_id=task_id,
        task=f"Fix the failing test in repo {task_id}.",
        group_id=group_id,
        success=success if success is not None else (reward is not None and reward >= 0.5),
        steps=[ScoredStep(step_index=i, **s) for i, s in enumerate(steps)],
        total_steps=len(steps),
        total_reward=reward,
        revision=revision,
        complete=complete,
        reward_version="rules-1",
        calibration_version="cal-1",
        policy_version=policy_version,
    )


def step(thought: str, tool: str, obs: str, process: float | None = None, **params) -> dict:
    return {"thought": thought, "tool": tool, "params": params, "observation": obs, "process_score": process}


def golden_group(task_id: str = "task-a") -> list[TrajectoryScored]:
    """Four rollouts of one task: all share step 0; they diverge at step 1."""
    s0 = step("List the repo first.", "bash", "src/ tests/ README.md", 0.8, cmd="ls")
    t1_steps = [
        s0,
        step("Run the tests.", "bash", "1 failed", 0.9, cmd="pytest"),
        step("Fix the off-by-one.", "write_file", "ok", 1.0, path="src/a.py", text="x = 1"),
    ]
    t2_steps = [s0, step("Read the code.", "read_file", "x = 0", 0.6, path="src/a.py")]
    t3_steps = [s0, step("Read the tests.", "read_file", "assert x", 0.5, path="tests/t.py")]
    t4_steps = [s0, step("Give up.", "", "", 0.1)]
    return [
        scored(f"{task_id}-t1", task_id, 0.9, t1_steps),
        scored(f"{task_id}-t2", task_id, 0.52, t2_steps),
        scored(f"{task_id}-t3", task_id, 0.5, t3_steps),
        scored(f"{task_id}-t4", task_id, 0.1, t4_steps),
    ]


def synthetic(n: int, group_size: int = 4, steps: int = 3, obs_len: int = 40) -> list[TrajectoryScored]:
    """`n` trajectories in groups of `group_size` per task, varied rewards (for streams and benches)."""
    out = []
    for i in range(n):
        task, member = i // group_size, i % group_size
        body = [
            step(
                f"step {s} of task {task}",
                TOOLS[(s + member) % 3],
                f"output line {s} " * (obs_len // 14),
                round(((s + member) % 5) / 4, 2),
                arg=f"{task}-{s}-{member}",
            )
            for s in range(steps)
        ]
        reward = round(((member * 7 + task * 3) % 11) / 10, 2)
        out.append(scored(f"traj-{i:05d}", f"task-{task:04d}", reward, body, group_id=f"grp-{task:04d}"))
    return out


def publish_sft_batches(bootstrap: str, data_dir: Path, count: int) -> list[str]:
    """`count` SFT batches of the golden group (members renamed per batch), written to `data_dir`'s
    batch store and published as the batch builder does: each batch's `batch.rows` chunks, then its
    `batch.built`, keyed by the batch id. Returns the batch ids in publishing order."""
    from kafka import KafkaProducer

    from consumers.batching.batch_writer import BatchStore
    from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
    from schemas import topics
    from schemas.codec import encode

    rows = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    store, producer, ids = BatchStore(data_dir), KafkaProducer(bootstrap_servers=bootstrap, acks="all"), []
    for n in range(count):
        members = [f"{r['trajectory_id']}-{n}" for r in rows]
        meta = {"trajectory_ids": members, "content_hashes": [], "source_offsets": {}, "reward_versions": [],
                "calibration_versions": [], "policy_versions": [], "builder_config": {}}  # fmt: skip
        manifest = store.write("sft", rows, meta)
        for event in manifest.events():
            producer.send(topics.TRAINING_BATCHES, key=manifest.batch_id.encode(), value=encode(event))
        ids.append(manifest.batch_id)
    producer.flush(30)
    producer.close()
    return ids
