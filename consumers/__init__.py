"""The consumers of the log: the ClickHouse sink (`sink/`), the trainer consumer that builds training
batches, and the training executor (`trainer/`). They import `schemas` and `clients` only, never the
CLI: `infra/commands/sink.py` and `infra/commands/trainer.py` build their configs from the command
line and call in. One exception root: `consumers/errors.py`.
"""
