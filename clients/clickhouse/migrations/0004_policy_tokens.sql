-- Steps recorded by the policy server carry how their tokens were taken (issue #13): whether the
-- prompt extended the previous turn token for token, where it broke, whether the step is usable for
-- token-level RL, which tokenizer + chat template rendered it, and why sampling stopped.
-- Token ids and logprobs themselves stay in `events.raw` (the trainer reads them from the topics).

ALTER TABLE agentstream.steps
    ADD COLUMN IF NOT EXISTS token_continuity LowCardinality(Nullable(String)),
    ADD COLUMN IF NOT EXISTS token_continuity_break Nullable(UInt32),
    ADD COLUMN IF NOT EXISTS token_rl_eligible Nullable(UInt8),
    ADD COLUMN IF NOT EXISTS tokenizer_hash Nullable(String),
    ADD COLUMN IF NOT EXISTS finish_reason LowCardinality(Nullable(String));
