"""The policy server's local engine: one base causal LM (transformers), optional LoRA adapters (peft),
a chat-template renderer and a sampling loop that returns each token's logprob.

What it owns: loading a base model and its tokenizer from a directory, loading adapters into it,
rendering messages (+ OpenAI `tools`) to prompt ids, sampling with a KV cache, and scoring a
completion with a fresh forward pass. The logprobs it stores are the log-softmax of the raw model
logits (fp32, temperature 1, before top-k / top-p), so the trainer can use them as behaviour-policy
logprobs whatever sampling settings produced the tokens.

What it must not do: import torch / transformers / peft at module import (they are imported inside
the functions that need them), download anything, or know about HTTP, Kafka or recording.

Engines made by `with_adapter` share the base weights: the adapters are loaded side by side into
one peft model, each engine activates its own under one lock for the length of a call (so calls
on engines of one base run one at a time), and an engine's adapter is dropped after the engine is
garbage collected.

Parts: `local` (LocalEngine), `loading` (base model, adapters, device, dtype), `shared_model`
(adapters side by side on one base), `sampling` (SamplingParams, Sample, the sampling loop),
`tokenizer` (hash, stop ids, context length) and `errors`. Import each name from its part.

    EngineError (ProducerError)    a base model or adapter that cannot be loaded, a bad request
"""
