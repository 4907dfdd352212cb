"""The trainer consumer: scored trajectories in, SFT / DPO / GRPO batch files and policy updates out.

Layout: `config` (every option, TRL-style dataclasses the CLI is generated from), `kinds` (the batch
kinds: name -> builder and training method), `chat` (trajectory -> chat messages), `builders/` (pure
batch builders), `planner` (the pure batching state machine), `tokenize` (pre-tokenized rows with
observation masking), `batch_writer` (atomic batch files and manifests), `consumer` (the
kafka-python shell), `executor` (LoRA training; torch imported lazily) and `follow` (its I/O shell),
`tiny` (a tiny local model for tests and benchmarks). Errors: `consumers/errors.py`.
"""
