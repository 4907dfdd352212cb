"""A policy server process for tests, the tiny model it serves, LoRA checkpoints and read-back of
the steps it recorded."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from clients.kafka import make_producer, read_to_end
from infra.bench.policy.reload import make_checkpoint  # a LoRA checkpoint laid out as the executor writes it
from schemas.codec import decode, encode, encode_key
from schemas.events import PolicyUpdated, StepRecorded, utc_now
from schemas.ids import new_event_id
from schemas.topics import AGENT_EVENTS, POLICY_UPDATES
from tests.support.processes import AGENTSTREAM, Proc, wait_for

__all__ = ["make_checkpoint", "policy_server", "publish_policy", "recorded_steps"]


@contextmanager
def policy_server(root: Path, bootstrap: str, base_dir: Path, *extra: str, env: dict | None = None):
    """`agentstream policy` on a free port; yields (base URL `http://host:port`, the process)."""
    ready = root / "policy.ready"
    ready.unlink(missing_ok=True)
    args = [*AGENTSTREAM, "policy", "--bootstrap-servers", bootstrap, "--data-dir", str(root / "data"),
            "--port", "0", "--ready-file", str(ready), "--base-model", str(base_dir), *extra]  # fmt: skip
    proc = Proc(args, root / "policy.log", env=env)

    def listening():
        if not proc.alive():
            raise RuntimeError(f"policy server exited: {proc.log_text()[-3000:]}")
        return ready.exists() and ready.read_text()

    try:
        address = wait_for(listening, timeout_s=120, what="the policy server to listen")
        yield f"http://{address}", proc
    finally:
        proc.stop()


def publish_policy(bootstrap: str, version: str, checkpoint: Path, previous: str | None = None) -> None:
    event = PolicyUpdated(
        event_id=new_event_id(),
        trajectory_id=version,
        occurred_at=utc_now(),
        producer="tests",
        policy_version=version,
        previous_version=previous,
        checkpoint_path=str(checkpoint),
    )
    producer = make_producer(bootstrap, "tests-policy")
    try:
        producer.send(POLICY_UPDATES, key=encode_key(event), value=encode(event)).get(timeout=30)
    finally:
        producer.close()


def recorded_steps(bootstrap: str, trajectory_id: str | None = None) -> list[StepRecorded]:
    """The steps on agent.events (of one trajectory), in step order."""
    events = [decode(r.value) for r in read_to_end(bootstrap, [AGENT_EVENTS], timeout_s=30)]
    steps = [e for e in events if isinstance(e, StepRecorded)]
    if trajectory_id is not None:
        steps = [s for s in steps if s.trajectory_id == trajectory_id]
    return sorted(steps, key=lambda s: s.step_index)
