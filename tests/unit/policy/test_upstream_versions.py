"""Versions in proxy mode against a scripted vLLM-like upstream: each LoRA version is loaded through
the runtime adapter API and sampled by name, old ones are unloaded outside the window (never one in
use), a refused load or a full fine-tune keeps the old version serving."""

from __future__ import annotations

import json
import threading
import time

import pytest

from producers.policy.engine.errors import EngineError
from producers.policy.engine.sampling import SamplingParams
from producers.policy.reload import PolicyReloader
from producers.policy.requests import PolicyConfig
from producers.policy.service import PolicyService
from producers.policy.upstream import UpstreamEngine, proxy_engine
from producers.policy.upstream_api import UpstreamError
from producers.policy.upstream_versions import LoadedVersions
from schemas.events import PolicyUpdated, utc_now
from schemas.ids import new_event_id
from tests.support.upstream_stub import scripted_upstream

PROMPT = [1, 2, 3]
PARAMS = SamplingParams(max_tokens=3)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture
def upstream():
    with scripted_upstream() as server:
        yield server


def lora(root, version):
    """`<root>/<version>/adapter/` as the executor writes it (the stub reads no weights)."""
    (root / version / "adapter").mkdir(parents=True)
    (root / version / "adapter" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    return root / version


def full_model(root, version):
    (root / version / "model").mkdir(parents=True)
    (root / version / "model" / "config.json").write_text("{}")
    return root / version


def test_a_version_is_loaded_by_name_and_sampled_while_the_old_engine_keeps_its_own(
    tokenizer_dir, upstream, tmp_path
):
    base = UpstreamEngine(upstream.url, tokenizer_dir)
    v1 = base.with_checkpoint(lora(tmp_path, "v1"), "v1")
    (load,) = upstream.bodies("/v1/load_lora_adapter")
    assert load == {"lora_name": "v1", "lora_path": str((tmp_path / "v1" / "adapter").resolve())}
    assert (v1.version, base.version) == ("v1", "base")
    assert v1.generate(PROMPT, PARAMS)[0].policy_version == "v1"
    assert base.generate(PROMPT, PARAMS)[0].policy_version == "base"
    assert [b["model"] for b in upstream.bodies("/v1/completions")] == ["v1", "tiny-base"]
    assert v1.tokenizer is base.tokenizer and v1.model_name == "tiny-base"


def test_a_name_the_upstream_already_has_is_replaced_in_place(tokenizer_dir, tmp_path):
    with scripted_upstream(adapters={"v1": "/elsewhere"}) as upstream:
        base = UpstreamEngine(upstream.url, tokenizer_dir)
        base.with_checkpoint(lora(tmp_path, "v1"), "v1")
        base.with_checkpoint(lora(tmp_path, "v2"), "v2")
        base.with_checkpoint(tmp_path / "v2", "v2")
    loads = upstream.bodies("/v1/load_lora_adapter")
    assert [b.get("load_inplace", False) for b in loads] == [True, False, True]
    assert upstream.loaded["v1"] == str((tmp_path / "v1" / "adapter").resolve())


def test_versions_outside_the_window_are_unloaded_never_the_one_serving(tokenizer_dir, upstream, tmp_path):
    engine = UpstreamEngine(upstream.url, tokenizer_dir, keep_versions=2)
    unloads = []
    for version in ("v1", "v2", "v3", "v4"):
        engine = engine.with_checkpoint(lora(tmp_path, version), version)  # as the reloader swaps
        unloads.append([b["lora_name"] for b in upstream.bodies("/v1/unload_lora_adapter")])
    assert unloads == [[], [], ["v1"], ["v1", "v2"]]
    assert sorted(upstream.loaded) == ["v3", "v4"]


def test_with_a_window_of_one_the_serving_version_stays_until_the_next_load(
    tokenizer_dir, upstream, tmp_path
):
    engine = UpstreamEngine(upstream.url, tokenizer_dir, keep_versions=1)
    v1 = engine.with_checkpoint(lora(tmp_path, "v1"), "v1")
    v2 = v1.with_checkpoint(lora(tmp_path, "v2"), "v2")  # v1 still serves until the swap
    assert upstream.bodies("/v1/unload_lora_adapter") == []
    assert v1.generate(PROMPT, PARAMS)[0].policy_version == "v1"
    v2.with_checkpoint(lora(tmp_path, "v3"), "v3")
    assert [b["lora_name"] for b in upstream.bodies("/v1/unload_lora_adapter")] == ["v1"]
    with pytest.raises(UpstreamError) as gone:  # a request still holding v1 two swaps later
        v1.generate(PROMPT, PARAMS)
    assert gone.value.status == 503 and "v1 was unloaded" in gone.value.message
    assert len(upstream.bodies("/v1/completions")) == 1


def test_a_load_waits_for_the_request_in_flight_and_its_version_goes_when_it_ends(
    tokenizer_dir, upstream, tmp_path
):
    engine = UpstreamEngine(upstream.url, tokenizer_dir, keep_versions=1)
    v1 = engine.with_checkpoint(lora(tmp_path, "v1"), "v1")
    upstream.hold = threading.Event()
    answers, newest = [], []
    running = threading.Thread(target=lambda: answers.append(v1.generate(PROMPT, PARAMS)))
    running.start()
    assert upstream.started.acquire(timeout=10)  # v1's request is at the upstream
    loads = threading.Thread(
        target=lambda: newest.append(
            v1.with_checkpoint(lora(tmp_path, "v2"), "v2").with_checkpoint(lora(tmp_path, "v3"), "v3")
        )
    )
    loads.start()
    time.sleep(0.5)
    # vLLM applies an adapter loaded mid-decode to the requests in flight: v2 waits (LoadGate)
    assert [b["lora_name"] for b in upstream.bodies("/v1/load_lora_adapter")] == ["v1"]
    upstream.hold.set()
    running.join(timeout=10)
    loads.join(timeout=10)
    assert answers[0][0].policy_version == "v1"
    assert [b["lora_name"] for b in upstream.bodies("/v1/load_lora_adapter")] == ["v1", "v2", "v3"]
    assert [b["lora_name"] for b in upstream.bodies("/v1/unload_lora_adapter")] == ["v1"]
    assert newest[0].generate(PROMPT, PARAMS)[0].policy_version == "v3"


def test_the_window_bookkeeping_forgets_an_unloaded_name():
    versions = LoadedVersions(keep=1)
    assert versions.added("v1", serving="base") == [] and versions.added("v2", serving="v1") == []
    assert versions.added("v3", serving="v2") == ["v1"]
    assert not versions.loaded("v1") and not versions.enter("v1")  # unloaded: no request may use it
    assert versions.added("v1", serving="v3") == ["v2"] and versions.enter("v1")
    with pytest.raises(ValueError, match="keep"):
        LoadedVersions(keep=0)


def test_a_refused_load_names_the_version_and_the_upstreams_answer(tokenizer_dir, upstream, tmp_path):
    upstream.refuse["v2"] = (500, {"error": {"message": "Error loading adapter: invalid safetensors header"}})
    v1 = UpstreamEngine(upstream.url, tokenizer_dir).with_checkpoint(lora(tmp_path, "v1"), "v1")
    with pytest.raises(EngineError) as refused:
        v1.with_checkpoint(lora(tmp_path, "v2"), "v2")
    assert "refused to load v2" in str(refused.value) and "invalid safetensors header" in str(refused.value)
    assert "HTTP 500" in str(refused.value) and sorted(upstream.loaded) == ["v1"]
    del upstream.refuse["v2"]
    assert v1.with_checkpoint(tmp_path / "v2", "v2").version == "v2"
    assert "load_inplace" not in upstream.bodies("/v1/load_lora_adapter")[-1]


def test_a_full_fine_tune_is_refused_saying_what_works(tokenizer_dir, upstream, tmp_path):
    engine = UpstreamEngine(upstream.url, tokenizer_dir)
    with pytest.raises(EngineError) as refused:
        engine.with_checkpoint(full_model(tmp_path, "v2"), "v2")
    assert "full fine-tune" in str(refused.value) and "LoRA versions only" in str(refused.value)
    assert "built-in engine" in str(refused.value) and upstream.bodies("/v1/load_lora_adapter") == []


def test_the_proxy_refuses_to_start_on_a_full_fine_tune_before_contacting_the_upstream(
    tokenizer_dir, upstream, tmp_path
):
    lora(tmp_path, "v1")
    full_model(tmp_path, "v2")
    (tmp_path / "latest").write_text("v2")
    config = PolicyConfig(upstream=upstream.url)
    with pytest.raises(EngineError, match=r"v2 is a full fine-tune .*built-in engine"):
        proxy_engine(config, tokenizer_dir, None, tmp_path)
    assert upstream.calls == []
    (tmp_path / "latest").write_text("v1")
    engine = proxy_engine(config, tokenizer_dir, None, tmp_path)
    assert engine.version == "v1" and list(upstream.loaded) == ["v1"]


def policy_updated(version, checkpoint):
    return PolicyUpdated(
        event_id=new_event_id(), trajectory_id=version, occurred_at=utc_now(), producer="tests",
        policy_version=version, previous_version=None, checkpoint_path=str(checkpoint),
    )  # fmt: skip


def test_the_reloader_serves_each_version_and_keeps_the_old_one_when_a_load_fails(
    tokenizer_dir, upstream, tmp_path
):
    service = PolicyService(UpstreamEngine(upstream.url, tokenizer_dir))
    reloader = PolicyReloader(service, "127.0.0.1:1")  # apply() only: no broker is read
    assert reloader.apply(policy_updated("v1", lora(tmp_path, "v1")))
    assert service.engine.version == "v1"
    upstream.refuse["v2"] = (404, {"error": {"message": "No adapter found for /x"}})
    assert not reloader.apply(policy_updated("v2", lora(tmp_path, "v2")))
    assert not reloader.apply(policy_updated("v3", full_model(tmp_path, "v3")))
    assert service.engine.version == "v1" and reloader.failures == ["v2", "v3"]
    assert service.engine.generate(PROMPT, PARAMS)[0].policy_version == "v1"
    assert reloader.apply(policy_updated("v4", lora(tmp_path, "v4")))
    assert service.engine.generate(PROMPT, PARAMS)[0].policy_version == "v4"
