"""The policy server's local engine: one base causal LM (transformers), optional LoRA adapters (peft)
or full fine-tunes, a chat-template renderer and a decode loop that batches concurrent requests and
returns each token's logprob.

What it owns: loading a base model and its tokenizer from a directory, loading checkpoints (adapters
into it, full fine-tunes beside it), rendering messages (+ OpenAI `tools`) to prompt ids, sampling
with continuous batching (every live request decoded in one forward pass per step, each with its
own KV cache rows and its own seeded generator), stop tokens and stop strings, per-token
alternatives (`top_logprobs`), and scoring a completion with a fresh forward pass. The logprobs it
stores are the log-softmax of the raw model logits (fp32, temperature 1, before top-k / top-p), so
the trainer can use them as behaviour-policy logprobs whatever sampling settings produced the tokens.

What it must not do: import torch / transformers / peft at module import (they are imported inside
the functions that need them), download anything, or know about HTTP, Kafka or recording.

Engines made by `with_checkpoint` share the base weights when the checkpoint is an adapter: the
adapters are loaded side by side into one peft model, requests of each adapter are batched together
and the adapters take turns per decode step (so one response never mixes versions), and an engine's
adapter is dropped after the engine is garbage collected. A full fine-tune is a model of its own,
with its own decode loop; the base stays loaded for adapters.

Parts: `local` (LocalEngine), `loading` (base model, checkpoints, device, dtype), `shared_model`
(adapters side by side on one model), `batching` (the decode loop per model), `padded_batch` (the
rows decoded together and their cache), `jobs` (one request's rows, generator and stop rules),
`sampling` (SamplingParams, Sample, the token pick, stop strings), `tokenizer` (stop ids, context
length) and `errors`. Import each name from its part.

    EngineError (ProducerError)    a base model or checkpoint that cannot be loaded, a bad request
"""
