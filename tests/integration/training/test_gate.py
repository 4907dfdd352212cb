"""Integration: the evaluation gate on the embedded broker, with the real in-process evaluator
(`infra.training_gate.build_gate`, as `agentstream train --gate` builds it).

v1 is trained (`train --batch`) until it solves the gate's calc task (the base model never does):
the gate accepts it against the base. v2 is trained from it by the follower (`train --follow`,
its batch.built read from training.batches), then its checkpoint is deliberately broken on disk
(every weight of the full fine-tune replaced by scaled noise) between the checkpoint and the gate's
evaluation: the gate refuses it, `policy.updates` holds both versions with their decisions, the
current policy and a policy server started afterwards stay on v1, and `agentstream lineage v2`
shows the refused version with its figures. Without the gate nothing would stop v2 being served.
The follower went back to v1's weights: v3 (trained by a restarted follower) names v1 as its
previous version, its weights are v1's plus one small update (not v2's noise), and it is accepted.
(A full fine-tune for v1-v3: on this tiny model LoRA does not learn the task in a test's budget. Then the
LoRA case: on v3's model as the base, a broken adapter is refused against that base.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from clients.current_policy import read_current_policy
from clients.kafka import ensure_topics, make_producer, read_to_end
from consumers.training.config import TrainConfig, TrainRunConfig
from consumers.training.follow import follow, train_file
from infra.learn.tasks import TOOLS, demonstration, write_tasks
from infra.training_gate import base_model_dir, build_gate
from producers.policy.server import VERSION_HEADER
from schemas.codec import decode, encode, encode_key
from schemas.events import BatchBuilt, utc_now
from schemas.topics import POLICY_UPDATES, TRAINING_BATCHES
from tests.integration.lineage.test_lineage import WRITER
from tests.support.broker import start_broker
from tests.support.policy import policy_server
from tests.support.processes import AGENTSTREAM, REPO

pytestmark = pytest.mark.integration

EXPRESSION = "2 + 3"
SAMPLES = 6  # 6 sampled + 1 greedy paired episodes: 5 or more lost by v2 and none won refuse it


def break_checkpoint(checkpoint: Path, scale: float = 3.0) -> None:
    """Replace every tensor of the checkpoint's weights (adapter or full model) by noise."""
    import torch
    from safetensors.torch import load_file, save_file

    files = sorted(checkpoint.glob("adapter/*.safetensors")) + sorted(checkpoint.glob("model/*.safetensors"))
    assert files, f"no weights under {checkpoint}"
    generator = torch.Generator().manual_seed(7)
    for path in files:
        tensors = load_file(path)
        noisy = {k: torch.randn(v.shape, generator=generator).to(v.dtype) * scale for k, v in tensors.items()}
        save_file(noisy, path, metadata={"format": "pt"})


def _batch(path: Path) -> Path:
    row = {"messages": demonstration(EXPRESSION), "tools": TOOLS}
    path.write_text(json.dumps(row) + "\n")
    return path


def _publish_batch(bootstrap: str, batch_id: str, path: Path) -> None:
    event = BatchBuilt(
        event_id=f"bb-{batch_id}", trajectory_id=batch_id, occurred_at=utc_now(), producer="test",
        batch_id=batch_id, kind="sft", path=str(path), row_count=1,
    )  # fmt: skip
    producer = make_producer(bootstrap, "test-batches")
    try:
        producer.send(TRAINING_BATCHES, key=encode_key(event), value=encode(event)).get(timeout=30)
    finally:
        producer.close()


def _policy_updates(bootstrap: str) -> list:
    return [decode(r.value) for r in read_to_end(bootstrap, [POLICY_UPDATES], 30)]


def _lineage(tmp_path: Path, bootstrap: str, version: str) -> tuple[str, dict]:
    """`agentstream lineage VERSION`, table and JSON, over chDB filled by the real sink rows from
    what is on `policy.updates`."""
    url = f"chdb://{tmp_path / 'clickhouse'}"
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(r.value + b"\n" for r in read_to_end(bootstrap, [POLICY_UPDATES], 30)))

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    run(sys.executable, "-c", WRITER, url, str(events))
    table = run(*AGENTSTREAM, "lineage", version, "--clickhouse-url", url).stdout
    as_json = json.loads(run(*AGENTSTREAM, "lineage", version, "--json", "--clickhouse-url", url).stdout)
    return table, as_json["version"]


def test_the_gate_refuses_a_broken_version_and_v1_stays_served(tmp_path):
    broker = start_broker(tmp_path / "broker")
    try:
        ensure_topics(broker.bootstrap)
        tasks = write_tasks((EXPRESSION,), tmp_path / "gate-tasks.jsonl", "gate")
        train = TrainConfig(
            lora=False,
            learning_rate=5e-3,
            epochs=150,
            micro_batch_size=1,
            lr_schedule="constant",
            device="cpu",
        )
        run = TrainRunConfig(
            bootstrap_servers=broker.bootstrap, data_dir=tmp_path / "data", method="sft",
            batch=_batch(tmp_path / "b1.jsonl"), gate=True, gate_tasks=tasks, gate_samples=SAMPLES,
            train=train,
        )  # fmt: skip
        gate = build_gate(run)
        v1 = train_file(run, gate)
        assert v1 is not None and v1.gate == "accepted", v1 and v1.gate_figures
        f1 = v1.gate_figures
        assert (f1["serving_version"], f1["episodes"], f1["serving_successes"]) == (0.0, SAMPLES + 1.0, 0.0)
        assert f1["candidate_successes"] >= 5, f1  # v1 really solves it: a broken v2 can be worse

        evaluate = gate.evaluate

        def broken_then_evaluated(candidate, serving):
            break_checkpoint(Path(candidate.checkpoint_path))
            return evaluate(candidate, serving)

        gate.evaluate = broken_then_evaluated
        # v2 through the follower (`train --follow --gate`): its batch.built read from training.batches
        _publish_batch(broker.bootstrap, "b2", _batch(tmp_path / "b2.jsonl"))
        follower = replace(run, follow=True, batch=None, idle_exit_s=3.0, train=replace(train, epochs=1))
        assert follow(follower, gate) == 0
        v2 = _policy_updates(broker.bootstrap)[-1]
        assert v2 is not None and v2.policy_version == "v2" and v2.gate == "refused", v2 and v2.gate_figures
        f2 = v2.gate_figures
        assert f2["serving_version"] == 1.0 and f2["worse"] >= 5 and f2["p_worse"] < 0.05, f2
        assert f2["serving_successes"] == f1["candidate_successes"]  # v1's score reused, same seeds

        published = _policy_updates(broker.bootstrap)
        assert [(e.policy_version, e.gate) for e in published] == [("v1", "accepted"), ("v2", "refused")]
        saved = json.loads((Path(v2.checkpoint_path) / "state.json").read_text())
        assert saved["last_event"]["gate"] == "refused"
        assert read_current_policy(broker.bootstrap).policy_version == "v1"

        with policy_server(tmp_path / "server", broker.bootstrap, base_model_dir(run)) as (url, _):
            served = httpx.get(f"{url}/v1/models", timeout=30).headers[VERSION_HEADER]
        assert served == "v1"

        table, row = _lineage(tmp_path, broker.bootstrap, "v2")
        assert "v2 <- parent v1" in table and "gate: REFUSED (never served) against v1" in table, table
        assert f"worse={int(f2['worse'])}" in table
        assert row["gate"] == "refused" and row["gate_figures"]["p_worse"] == pytest.approx(f2["p_worse"])

        # the follower went back to v1's weights at once: `latest` names v1, v2's checkpoint is kept
        checkpoints = run.data_dir / "checkpoints"
        assert (checkpoints / "latest").read_text() == "v1" and saved["policy_version"] == "v2"
        # v3 (a restarted follower) is numbered on, trained from v1 (not from v2's broken weights)
        gate.evaluate = evaluate
        _publish_batch(broker.bootstrap, "b3", _batch(tmp_path / "b3.jsonl"))
        assert follow(follower, gate) == 0
        v3 = _policy_updates(broker.bootstrap)[-1]
        assert (v3.policy_version, v3.previous_version, v3.gate) == ("v3", "v1", "accepted"), v3.gate_figures
        assert v3.gate_figures["serving_version"] == 1.0
        to_v1, to_v2 = (_distance(checkpoints / "v3", checkpoints / v) for v in ("v1", "v2"))
        assert to_v1 < 0.01 * to_v2, (to_v1, to_v2)
        assert read_current_policy(broker.bootstrap).policy_version == "v3"
    finally:
        broker.stop()
    _a_broken_adapter_is_refused(tmp_path, checkpoints / "v3" / "model")


def _a_broken_adapter_is_refused(tmp_path: Path, base: Path) -> None:
    """The issue's case in LoRA form: on a base that solves the task (v3's full model above, taken as
    `--base-model`), a LoRA version whose adapter is broken is refused against the base it would
    replace, and nothing becomes current."""
    broker = start_broker(tmp_path / "broker-lora")
    try:
        ensure_topics(broker.bootstrap)
        tasks = write_tasks((EXPRESSION,), tmp_path / "gate-tasks-lora.jsonl", "gate")
        train = TrainConfig(
            base_model=str(base), lora=True, learning_rate=1e-4, micro_batch_size=1, lr_schedule="constant",
            device="cpu",
        )  # fmt: skip
        run = TrainRunConfig(
            bootstrap_servers=broker.bootstrap, data_dir=tmp_path / "data-lora", method="sft",
            batch=_batch(tmp_path / "l1.jsonl"), gate=True, gate_tasks=tasks, gate_samples=SAMPLES,
            train=train,
        )  # fmt: skip
        gate = build_gate(run)
        evaluate = gate.evaluate

        def adapter_broken_then_evaluated(candidate, serving):
            assert list(Path(candidate.checkpoint_path).glob("adapter/*.safetensors"))  # LoRA, not a model
            break_checkpoint(Path(candidate.checkpoint_path))
            return evaluate(candidate, serving)

        gate.evaluate = adapter_broken_then_evaluated
        v1 = train_file(run, gate)
        assert v1 is not None and v1.gate == "refused", v1 and v1.gate_figures
        figures = v1.gate_figures
        assert figures["serving_version"] == 0.0 and figures["serving_successes"] >= 5, figures
        assert figures["worse"] >= 5 and figures["p_worse"] < 0.05, figures
        assert read_current_policy(broker.bootstrap) is None  # the base keeps serving
    finally:
        broker.stop()


def _distance(a: Path, b: Path) -> float:
    """Sum over the full model's tensors of the mean absolute difference between two checkpoints."""
    from safetensors.torch import load_file

    def weights(checkpoint: Path) -> dict:
        return {k: v for f in sorted(checkpoint.glob("model/*.safetensors")) for k, v in load_file(f).items()}

    left, right = weights(a), weights(b)
    assert left and set(left) == set(right)
    return sum(float((left[k].float() - right[k].float()).abs().mean()) for k in left)


def test_train_refuses_gate_options_it_cannot_use(tmp_path):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text(json.dumps({"task_id": "t1", "env": "echo", "task": {}}) + "\n")
    for extra, expected in (
        ([], ["--gate: give the held-out tasks with --gate-tasks FILE"]),
        (["--gate-tasks", str(bad)], ["--gate-tasks: " + str(bad), "task 't1': field 'env'"]),
    ):
        done = subprocess.run(
            [*AGENTSTREAM, "train", "--follow", "--gate", "--data-dir", str(tmp_path / "d"), *extra],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode != 0 and all(part in done.stderr for part in expected), done.stderr[-2000:]
        assert "Traceback" not in done.stderr


def _group_rank(rank: int, world_size: int, port: int, data_dir: str, out_dir: str) -> None:
    """One rank of the group test: rank 0 follows (trains b1, b2; the gate refuses v2; trains b3)
    through `LeadExecutor`, rank 1 follows rank 0's items; each writes its weights at the end."""
    import os

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )  # fmt: skip
    import torch

    from consumers.training import distributed
    from consumers.training.executor import TrainingExecutor
    from consumers.training.gate import Gate, PairedOutcomes
    from consumers.training.group_work import LeadExecutor, follow_lead

    torch.set_num_threads(1)
    ranks = distributed.join_group("cpu", timeout_s=300)
    try:
        executor = TrainingExecutor(GROUP_CONFIG, data_dir, ranks)
        if rank == 0:
            lead, rows = (
                LeadExecutor(executor, ranks),
                [{"messages": demonstration(e), "tools": TOOLS} for e in ("2 + 3", "4 * 5")],
            )
            v1 = lead.train_batch(rows, "sft", "b1")
            refuse = Gate(
                lambda c, s: PairedOutcomes(s.policy_version, (True,) * 6, (False,) * 6), lambda: v1
            )
            v2 = refuse.settle(lead.train_batch(rows, "sft", "b2"), lead)
            v3 = lead.train_batch(rows, "sft", "b3")
            lead.stop_others()
            Path(out_dir, "events.json").write_text(
                json.dumps([e.model_dump(mode="json") for e in (v1, v2, v3)])
            )
        else:
            follow_lead(executor, ranks)
        weights = {n: p.detach() for n, p in executor.model.named_parameters() if p.requires_grad}
        torch.save(weights, Path(out_dir, f"rank{rank}.pt"))
    finally:
        distributed.leave_group()


GROUP_CONFIG = TrainConfig(learning_rate=5e-2, micro_batch_size=1, lr_schedule="constant", device="cpu")


def test_every_rank_of_a_group_goes_back_to_the_serving_weights(tmp_path):
    """`--nproc 2`: the gate refuses v2 on rank 0; both ranks go back to v1 and train v3 from it with
    the same weights (a rank left on v2 would diverge, and would refuse rank 0's next item)."""
    import torch
    import torch.multiprocessing as mp

    from tests.support.training_ranks import free_port

    data_dir = tmp_path / "data"
    mp.start_processes(
        _group_rank, args=(2, free_port(), str(data_dir), str(tmp_path)), nprocs=2, join=True,
        start_method="spawn",
    )  # fmt: skip
    v1, v2, v3 = json.loads((tmp_path / "events.json").read_text())
    assert (v2["gate"], v3["policy_version"], v3["previous_version"]) == ("refused", "v3", "v1")
    assert v3["step"] == v1["step"] + 1
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert rank0.keys() == rank1.keys() and all(torch.equal(rank0[n], rank1[n]) for n in rank0)
    assert (data_dir / "checkpoints" / "latest").read_text() == "v3"
