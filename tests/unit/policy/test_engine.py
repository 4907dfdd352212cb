"""The policy engine on the tiny local model (CPU): stored logprobs are what a fresh forward pass
gives, seeds reproduce, sampling filters behave, adapters load (checkpoint or adapter dir), full
fine-tunes are served beside the base, and a bad base or checkpoint is a one-line EngineError that
leaves a serving engine as it was."""

from __future__ import annotations

import gc
import json
import shutil

import pytest

from producers.policy.engine.errors import EngineError
from producers.policy.engine.local import LocalEngine
from producers.policy.engine.sampling import SamplingParams, filter_logits

TOL = 1e-4
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls"}}}],
    },
    {"role": "tool", "content": "main.py\ntest_main.py"},
    {"role": "user", "content": "Now run the tests."},
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("policy-tiny"))


@pytest.fixture(scope="module")
def engine(base):
    return LocalEngine(base, device="cpu")


@pytest.fixture(scope="module")
def prompt(engine):
    return engine.render([{"role": "user", "content": "Solve the task."}])


def _lora(base, target, hidden_size=None, scale=0.2):
    """A LoRA adapter (r=4 on q/v) with perturbed weights saved to `target`; another base shape
    when `hidden_size` is given."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from consumers.tiny_model import build_model

    if hidden_size is None:
        model = AutoModelForCausalLM.from_pretrained(base)
    else:
        model = build_model(AutoTokenizer.from_pretrained(base), hidden_size=hidden_size)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn(param.shape, generator=generator) * scale)
    peft_model.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def checkpoint(base, tmp_path_factory):
    """A trainer-style checkpoint dir: `<ckpt>/adapter/` holds the adapter."""
    ckpt = tmp_path_factory.mktemp("ckpt") / "v1"
    _lora(base, ckpt / "adapter")
    return ckpt


def _assert_logprobs_are_scores(engine, prompt_ids, samples):
    for sample in samples:
        assert len(sample.logprobs) == len(sample.token_ids) > 0
        scored = engine.score(prompt_ids, sample.token_ids)
        assert scored == pytest.approx(sample.logprobs, abs=TOL)


# --- logprobs ---------------------------------------------------------------------------------------


def test_sampled_and_greedy_logprobs_equal_a_fresh_forward_pass(engine, prompt):
    sampled = engine.generate(prompt, SamplingParams(temperature=1.0, seed=1, max_tokens=24, n=3))
    greedy = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=24))
    _assert_logprobs_are_scores(engine, prompt, sampled + greedy)


def test_logprobs_are_raw_whatever_the_temperature_and_filters(engine, prompt):
    params = SamplingParams(temperature=0.3, top_k=5, top_p=0.8, seed=2, max_tokens=16, n=2)
    _assert_logprobs_are_scores(engine, prompt, engine.generate(prompt, params))


def test_tool_conversation_renders_and_its_logprobs_equal_scores(engine):
    prompt_ids = engine.render(CONVERSATION, TOOLS)
    assert all(type(i) is int for i in prompt_ids)
    text = engine.tokenizer.decode(prompt_ids)
    assert '"name": "bash"' in text and "test_main.py" in text and "# Tools" in text
    assert text.endswith("<|im_start|>assistant\n")
    samples = engine.generate(prompt_ids, SamplingParams(seed=3, max_tokens=20, n=2))
    _assert_logprobs_are_scores(engine, prompt_ids, samples)


def test_rows_that_stop_early_leave_the_batch_without_shifting_the_others(base, prompt):
    """Stop on the tokens sampled most often, so rows of one batch end at different steps."""
    engine = LocalEngine(base, device="cpu")
    params = SamplingParams(seed=4, max_tokens=24, n=8)
    free = [t for s in engine.generate(prompt, params) for t in s.token_ids]
    engine.stop_ids = sorted(set(free), key=free.count)[-3:]
    samples = engine.generate(prompt, params)
    lengths = {len(s.token_ids) for s in samples}
    assert len(lengths) > 1, lengths
    for sample in samples:
        *body, last = sample.token_ids
        assert not set(body) & set(engine.stop_ids)
        expected = "stop" if last in engine.stop_ids else "length"
        assert sample.finish_reason == expected
        assert expected == "stop" or len(sample.token_ids) == params.max_tokens
    _assert_logprobs_are_scores(engine, prompt, samples)


# --- sampling ---------------------------------------------------------------------------------------


def test_same_seed_same_samples_and_n_samples(engine, prompt):
    params = SamplingParams(seed=11, max_tokens=12, n=3)
    first, again = engine.generate(prompt, params), engine.generate(prompt, params)
    assert first == again and len(first) == 3
    assert all(len(s.logprobs) == len(s.token_ids) for s in first)
    other = engine.generate(prompt, SamplingParams(seed=12, max_tokens=12, n=3))
    assert [s.token_ids for s in other] != [s.token_ids for s in first]


def test_max_tokens_is_respected_with_finish_reason_length(engine, prompt):
    samples = engine.generate(prompt, SamplingParams(seed=5, max_tokens=5, n=4))
    assert [len(s.token_ids) for s in samples] == [5] * 4
    assert {s.finish_reason for s in samples} == {"length"}
    assert samples[0].text == engine.decode(samples[0].token_ids)


def test_greedy_is_the_argmax_of_a_fresh_forward_pass(base, engine, prompt):
    import torch
    from transformers import AutoModelForCausalLM

    greedy = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=16, n=2))
    assert greedy[0].token_ids == greedy[1].token_ids
    model = AutoModelForCausalLM.from_pretrained(base).eval()
    ids = [*prompt, *greedy[0].token_ids]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    argmax = logits[len(prompt) - 1 : len(ids) - 1].argmax(-1).tolist()
    assert greedy[0].token_ids == argmax


def test_top_k_1_and_a_tiny_top_p_are_greedy(engine, prompt):
    greedy = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=16))[0].token_ids
    top_k = engine.generate(prompt, SamplingParams(top_k=1, seed=6, max_tokens=16, n=2))
    top_p = engine.generate(prompt, SamplingParams(top_p=1e-6, seed=6, max_tokens=16))
    assert [s.token_ids for s in top_k + top_p] == [greedy] * 3


def test_filter_logits_keeps_top_k_then_the_nucleus():
    import torch

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda **kw: torch.isfinite(filter_logits(logits, SamplingParams(**kw)))[0].tolist()  # noqa: E731
    assert kept(top_k=2) == [True, True, False, False]
    assert kept(top_p=0.5) == [True, False, False, False]
    assert kept(top_p=0.6) == [True, True, False, False]
    assert kept(top_p=0.9, top_k=2) == [True, True, False, False]
    scaled = filter_logits(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(scaled, logits * 2)


def test_sampling_params_name_the_bad_field():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(seed=3).as_dict()["seed"] == 3


def test_tokenizer_hash_names_tokenizer_and_template(base, engine, tmp_path):
    assert engine.model_name == "tiny" and engine.version == "base"
    assert len(engine.tokenizer_hash) == 16 and engine.tokenizer_hash == LocalEngine(base).tokenizer_hash
    other = shutil.copytree(base, tmp_path / "tiny")
    template = other / "chat_template.jinja"
    template.write_text(template.read_text() + "\n")
    assert LocalEngine(other).tokenizer_hash != engine.tokenizer_hash


# --- adapters ---------------------------------------------------------------------------------------


def test_adapter_from_a_checkpoint_or_its_adapter_dir(base, engine, prompt, checkpoint):
    from_ckpt = LocalEngine(base, adapter=checkpoint, version="v1", device="cpu")
    from_dir = LocalEngine(base, adapter=checkpoint / "adapter", version="v1", device="cpu")
    samples = from_ckpt.generate(prompt, SamplingParams(seed=8, max_tokens=16, n=2))
    _assert_logprobs_are_scores(from_ckpt, prompt, samples)
    tokens = samples[0].token_ids
    adapted = from_ckpt.score(prompt, tokens)
    assert from_dir.score(prompt, tokens) == pytest.approx(adapted, abs=TOL)
    assert max(abs(a - b) for a, b in zip(adapted, engine.score(prompt, tokens), strict=True)) > 1e-2
    assert from_ckpt.version == "v1"


def test_with_checkpoint_shares_the_base_and_leaves_the_old_engine_as_it_was(base, prompt, checkpoint):
    old = LocalEngine(base, device="cpu")
    params = SamplingParams(seed=9, max_tokens=16)
    before = old.generate(prompt, params)
    new = old.with_checkpoint(checkpoint, "v1")
    assert new.version == "v1" and old.version == "base"
    assert new._shared is old._shared  # one copy of the base weights
    reference = LocalEngine(base, adapter=checkpoint, device="cpu")
    tokens = before[0].token_ids
    assert new.score(prompt, tokens) == pytest.approx(reference.score(prompt, tokens), abs=TOL)
    assert old.generate(prompt, params) == before  # the adapter is off for the base engine
    _assert_logprobs_are_scores(new, prompt, new.generate(prompt, params))
    del new
    gc.collect()
    assert old.generate(prompt, params) == before
    assert not hasattr(old._shared.model, "peft_config")  # the dropped adapter was unloaded


def test_missing_base_is_an_engine_error_naming_the_path(tmp_path):
    with pytest.raises(EngineError, match=f"base model {tmp_path / 'nope'}: no such directory"):
        LocalEngine(tmp_path / "nope")
    with pytest.raises(EngineError, match=f"base model {tmp_path}: no config.json"):
        LocalEngine(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(EngineError, match=f"base model {tmp_path}: cannot load"):
        LocalEngine(tmp_path)


def test_bad_adapters_raise_and_the_engine_keeps_serving(base, prompt, checkpoint, tmp_path):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "adapter_config.json").write_text("{garbage")
    other_base = _lora(base, tmp_path / "other-shape", hidden_size=32)
    missing = tmp_path / "missing"
    with pytest.raises(EngineError, match=f"adapter {garbage}: cannot load"):
        LocalEngine(base, adapter=garbage)
    with pytest.raises(EngineError, match=f"checkpoint {missing}: no such directory"):
        LocalEngine(base, adapter=missing)
    old = LocalEngine(base, device="cpu")
    params = SamplingParams(seed=10, max_tokens=12, n=2)
    before = old.generate(prompt, params)
    for bad in (garbage, missing, other_base):  # other_base fails after injection: it is rolled back
        with pytest.raises(EngineError, match=f"(adapter|checkpoint) {bad}"):
            old.with_checkpoint(bad, "v2")
        assert old.generate(prompt, params) == before
    assert json.loads((checkpoint / "adapter" / "adapter_config.json").read_text())["r"] == 4
    new = old.with_checkpoint(checkpoint, "v2")
    _assert_logprobs_are_scores(new, prompt, new.generate(prompt, params))
    assert old.generate(prompt, params) == before


def test_a_reload_chain_loads_each_adapter_while_the_previous_one_is_live(base, prompt, checkpoint, tmp_path):
    """v1 -> v2 -> v3, each loaded while the version before it still serves (as hot reload does)."""
    first = LocalEngine(base, device="cpu").with_checkpoint(checkpoint, "v1")
    second = first.with_checkpoint(_lora(base, tmp_path / "v2" / "adapter", scale=0.3), "v2")
    third = second.with_checkpoint(_lora(base, tmp_path / "v3" / "adapter", scale=0.4), "v3")
    tokens = first.generate(prompt, SamplingParams(seed=1, max_tokens=8))[0].token_ids
    scores = [engine.score(prompt, tokens) for engine in (first, second, third)]
    assert [engine.version for engine in (first, second, third)] == ["v1", "v2", "v3"]
    for engine in (first, second, third):
        _assert_logprobs_are_scores(
            engine, prompt, engine.generate(prompt, SamplingParams(seed=2, max_tokens=8))
        )
    reference = LocalEngine(base, adapter=tmp_path / "v3", device="cpu")
    assert scores[2] == pytest.approx(reference.score(prompt, tokens), abs=TOL)


# --- full fine-tunes --------------------------------------------------------------------------------


def _full_checkpoint(base, root, version: str, scale: float = 0.05, tokenizer=None):
    """`<root>/<version>/model/` as the executor writes it (`save_checkpoint`, lora=False): the base
    with perturbed weights, and a tokenizer (the base's unless given)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from consumers.training.checkpoints import save_checkpoint
    from consumers.training.versions import TrainState

    model = AutoModelForCausalLM.from_pretrained(base)
    generator = torch.Generator().manual_seed(13)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(base)
    return save_checkpoint(root, TrainState(policy_version=version), model, tokenizer, optimizer, lora=False)


def test_a_full_fine_tune_is_served_beside_the_base(base, engine, prompt, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    ckpt = _full_checkpoint(base, tmp_path, "v1")
    params = SamplingParams(seed=71, max_tokens=16, n=2)
    before = engine.generate(prompt, params)
    full = engine.with_checkpoint(ckpt, "v1")
    assert full.version == "v1" and engine.version == "base"
    assert full._shared is not engine._shared  # a model of its own, with its own decode loop
    assert (full.tokenizer_hash, full.base_model_id) == (engine.tokenizer_hash, engine.base_model_id)
    samples = full.generate(prompt, params)
    _assert_logprobs_are_scores(full, prompt, samples)
    reference = AutoModelForCausalLM.from_pretrained(ckpt / "model").eval()
    tokens = samples[0].token_ids
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([[*prompt, *tokens]])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()
    assert samples[0].logprobs == pytest.approx(expected, abs=TOL)
    assert max(abs(a - b) for a, b in zip(expected, engine.score(prompt, tokens), strict=True)) > 1e-2
    assert engine.generate(prompt, params) == before  # the old engine serves as it did
    assert full.with_checkpoint(ckpt / "model", "v1b").score(prompt, tokens) == pytest.approx(
        expected, abs=TOL
    )


def test_an_adapter_after_a_full_fine_tune_goes_on_the_base(base, engine, prompt, checkpoint, tmp_path):
    full = engine.with_checkpoint(_full_checkpoint(base, tmp_path, "v1"), "v1")
    adapted = full.with_checkpoint(checkpoint, "v2")
    assert adapted._shared is engine._shared
    reference = LocalEngine(base, adapter=checkpoint, device="cpu")
    tokens = engine.generate(prompt, SamplingParams(seed=72, max_tokens=8))[0].token_ids
    assert adapted.score(prompt, tokens) == pytest.approx(reference.score(prompt, tokens), abs=TOL)


def test_bad_full_checkpoints_raise_naming_the_path_and_the_engine_keeps_serving(
    base, engine, prompt, tmp_path
):
    from consumers.tiny_model import train_tokenizer

    params = SamplingParams(seed=73, max_tokens=8)
    before = engine.generate(prompt, params)
    other_vocab = _full_checkpoint(
        base, tmp_path / "a", "v1", tokenizer=train_tokenizer(["zz yy xx ww " * 20])
    )
    corrupt = _full_checkpoint(base, tmp_path / "b", "v2")
    weights = next((corrupt / "model").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    empty = tmp_path / "c" / "v3"
    empty.mkdir(parents=True)
    cases = [
        (other_vocab, f"checkpoint {other_vocab / 'model'}: its tokenizer .* vocabulary"),
        (corrupt, f"checkpoint {corrupt / 'model'}: cannot load"),
        (empty, f"checkpoint {empty}: no adapter_config.json or config.json"),
        (tmp_path / "nope", f"checkpoint {tmp_path / 'nope'}: no such directory"),
    ]
    for path, message in cases:
        with pytest.raises(EngineError, match=message):
            engine.with_checkpoint(path, "vX")
    assert engine.generate(prompt, params) == before
