"""The training executor (`agentstream train`): batch files in, LoRA / full fine-tunes and
`policy.updated` events out.

Layout: `config` (`TrainRunConfig` and the executor's `TrainConfig`, the CLI is generated from
them), `executor` (SFT / DPO / GRPO training; torch imported lazily), `row_tensors` (batch rows as
padded tensors), `reference` (the reference policy of DPO and GRPO's KL), `losses` (the loss
functions), `offpolicy` (GRPO staleness, importance sampling, schedules), `versions` (the trainer
state, version numbering, the `policy.updated` event), `checkpoints` (the files on disk and the
`latest` pointer) and `follow` (the I/O shell: one batch file, or `training.batches` followed).
Batch files, kinds and chat rendering come from `consumers.batching` (this package imports it; it
never imports this one); the tiny local model is `consumers.tiny_model`. Errors: `consumers/errors.py`.
"""
