"""The consumers of the log: the ClickHouse sink (`sink/`), the batch builder (`batching/`) and the
training executor (`training/`, which reads the batch builder's files), with the tiny local model
both can load (`tiny_model.py`: tests, benchmarks, `tiny`). They import `schemas` and `clients`
only, never the CLI: `infra/commands/sink.py` and `infra/commands/batch_train.py` build their
configs from the command line and call in. One exception root: `consumers/errors.py`.
"""
