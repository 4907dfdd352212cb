"""The batch builder (`agentstream batch`): scored trajectories in, SFT / DPO / GRPO batch files and
`batch.built` events out.

Layout: `config` (every option, TRL-style dataclasses the CLI is generated from), `kinds` (the batch
kinds: name -> builder and training method), `chat` (trajectory -> chat messages), `builders/` (pure
batch builders), `planner` (the pure batching state machine), `tokenize` (pre-tokenized rows with
observation masking), `token_rows` (token-faithful rows from recorded token ids), `batch_writer`
(atomic batch files and manifests: the contract `consumers.training` reads) and `consumer` (the
kafka-python shell). Training on the batches is `consumers.training`, which imports from here,
never the other way. Errors: `consumers/errors.py`.
"""
