"""Any checkpoint is served, and only one built on the server's base (issue #36), by a real
`agentstream policy` process, from full fine-tunes the real executor trained (`lora=False`).

- a full fine-tune is hot-swapped in on `policy.updated` (base -> v1 -> v2), and a restarted server
  serves the newest one at start: each time the served logprobs are those of that version's weights;
- a corrupt newest checkpoint at restart: the server starts on the previous valid version, and its
  log names the corrupt one (no crash loop);
- a `policy.updated` built on another base (base_model_id or tokenizer_hash) is refused in one log
  line naming both values, the old version serving on; a later valid update is still loaded.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from schemas.events import PolicyUpdated
from tests.support.policy import policy_server
from tests.support.policy_updates import publish_updates
from tests.support.processes import wait_for

pytestmark = pytest.mark.integration

PROMPT = [5, 17, 42, 99, 3, 250, 61]  # token ids of the tiny vocabulary (512)
SAMPLING = {"max_tokens": 8, "temperature": 1.0, "seed": 11}


@dataclass(frozen=True)
class Trained:
    base: Path  # the tiny base model
    root: Path  # the executor's checkpoint root: v1, v2 full fine-tunes, `latest` -> v2
    events: dict[str, PolicyUpdated]  # the executor's policy.updated of each version


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Trained:
    """Two SFT steps of a full fine-tune by the executor, on the tiny model."""
    from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig
    from consumers.tiny_model import tiny_model_dir
    from consumers.training.config import TrainConfig
    from consumers.training.executor import TrainingExecutor
    from tests.support.trainer_data import golden_group

    data_dir = tmp_path_factory.mktemp("executor")
    base = tiny_model_dir(data_dir)
    executor = TrainingExecutor(TrainConfig(lora=False, learning_rate=5e-3, micro_batch_size=4), data_dir)
    rows = SFTBuilder(SFTBuilderConfig(require_success=False)).build(golden_group())
    events = {}
    for batch in ("b1", "b2"):
        event = executor.train_batch(rows, "sft", batch)
        events[event.policy_version] = event
    root = data_dir / "checkpoints"
    assert sorted(events) == ["v1", "v2"] and (root / "v2" / "model").is_dir()
    assert not (root / "v2" / "adapter").exists()  # a full fine-tune, not an adapter
    del executor
    return Trained(base, root, events)


def sample(url: str) -> dict:
    """Token-in sampling with a fixed seed: the served version, the token ids and their logprobs."""
    body = {"model": "policy", "prompt": PROMPT, **SAMPLING}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    return {
        "version": reply.json()["policy_version"],
        "token_ids": choice["token_ids"],
        "logprobs": choice["logprobs"]["token_logprobs"],
    }


def logprobs_under(model_dir: Path, completion: list[int]) -> list[float]:
    """The logprobs of `completion` after PROMPT under the weights saved in `model_dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([PROMPT + completion])).logits[0, len(PROMPT) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        return logprobs.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


def served_version(url: str) -> str:
    return httpx.get(f"{url}/healthz", timeout=30).json()["policy_version"]


def assert_weights_of(model_dir: Path, got: dict) -> None:
    assert got["logprobs"] == pytest.approx(logprobs_under(model_dir, got["token_ids"]), abs=1e-4)


def test_a_full_fine_tune_is_served_after_a_hot_swap_and_after_a_restart(tmp_path, broker, trained):
    with policy_server(tmp_path / "s1", broker.bootstrap, trained.base) as (url, _):
        before = sample(url)
        assert before["version"] == "base"
        assert_weights_of(trained.base, before)

        publish_updates(broker.bootstrap, [trained.events["v1"]])
        wait_for(lambda: served_version(url) == "v1", timeout_s=60, what="the server to serve v1")
        v1 = sample(url)
        assert v1["version"] == "v1"
        assert (v1["token_ids"], v1["logprobs"]) != (before["token_ids"], before["logprobs"])
        assert_weights_of(trained.root / "v1" / "model", v1)

        publish_updates(broker.bootstrap, [trained.events["v2"]])  # full fine-tune over full fine-tune
        wait_for(lambda: served_version(url) == "v2", timeout_s=60, what="the server to serve v2")
        v2 = sample(url)
        assert v2["version"] == "v2"
        assert_weights_of(trained.root / "v2" / "model", v2)

    # a new process, not following updates: what it serves is what it chose at start
    args = ("--checkpoints", str(trained.root), "--no-follow")
    with policy_server(tmp_path / "s2", broker.bootstrap, trained.base, *args) as (url, _):
        again = sample(url)
    assert again["version"] == "v2" and again["token_ids"] == v2["token_ids"]
    assert again["logprobs"] == pytest.approx(v2["logprobs"], abs=1e-5)


def test_a_corrupt_newest_checkpoint_at_restart_serves_the_previous_valid_version(tmp_path, broker, trained):
    root = tmp_path / "checkpoints"
    shutil.copytree(trained.root, root)
    weights = next((root / "v2" / "model").glob("*.safetensors"))
    weights.write_bytes(b"not a safetensors file")  # `latest` still names v2

    for restart in ("s1", "s2"):  # each restart comes up, on v1
        with policy_server(
            tmp_path / restart, broker.bootstrap, trained.base, "--checkpoints", str(root)
        ) as run:
            url, proc = run
            got = sample(url)
            log = proc.log_text()
        assert got["version"] == "v1"
        assert_weights_of(root / "v1" / "model", got)
        skipped = [line for line in log.splitlines() if "policy start: checkpoint v2" in line]
        assert len(skipped) == 1 and str(root / "v2") in skipped[0], log[-3000:]


def test_a_version_built_on_another_base_is_refused(tmp_path, broker, trained):
    from transformers import AutoTokenizer

    from clients.base_model import base_model_id, tokenizer_hash

    ours = {
        "base_model_id": base_model_id(trained.base),
        "tokenizer_hash": tokenizer_hash(AutoTokenizer.from_pretrained(trained.base), trained.base),
    }
    v1 = trained.events["v1"]
    assert ours["base_model_id"] and ours["tokenizer_hash"]
    assert (v1.base_model_id, v1.tokenizer_hash) == (
        ours["base_model_id"],
        ours["tokenizer_hash"],
    )  # one base

    def update(version: str, **base: str) -> PolicyUpdated:
        names = {"event_id": f"pu-{version}", "trajectory_id": version, "policy_version": version}
        return v1.model_copy(update={**names, "step": int(version[1:]), **ours, **base})

    foreign = {"v3": {"base_model_id": "f" * 16}, "v4": {"tokenizer_hash": "e" * 16}}
    args = ("--checkpoints", str(trained.root))
    with policy_server(tmp_path, broker.bootstrap, trained.base, *args) as (url, proc):
        assert served_version(url) == "v2"  # the newest at start
        for version, base in foreign.items():
            publish_updates(broker.bootstrap, [update(version, **base)])
            line = f"policy reload: {version} refused"
            wait_for(lambda line=line: line in proc.log_text(), timeout_s=60, what=f"{version} refused")
            assert served_version(url) == "v2"
        publish_updates(broker.bootstrap, [update("v5")])  # the same weights, on our base: served
        wait_for(lambda: served_version(url) == "v5", timeout_s=60, what="the server to serve v5")
        assert_weights_of(trained.root / "v1" / "model", sample(url))
        log = proc.log_text()

    for version, base in foreign.items():
        [line] = [line for line in log.splitlines() if f"policy reload: {version} refused" in line]
        (field, theirs), = base.items()  # fmt: skip
        assert theirs in line and ours[field] in line and "still serving v2" in line
