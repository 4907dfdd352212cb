"""The trainer consumer: scored trajectories in, SFT / DPO / GRPO batch files and policy updates out.

Layout: `chat` (trajectory -> chat messages), `builders/` (pure batch builders), `tokenize`
(pre-tokenized rows with observation masking), `batch_writer` (atomic batch files and manifests),
`consumer` (the kafka-python shell), `executor` (LoRA training; torch imported lazily), `tiny`
(a tiny local model for tests and benchmarks).
"""
