-- The base a version was trained on (issue #36, schema 1.4): `policy.updated` names the base weights
-- and config (`base_model_id`) and the tokenizer and chat template (`tokenizer_hash`) the executor
-- trained, computed by `clients.base_model`. Versions written before keep '' here: unknown.

ALTER TABLE agentstream.policy_versions
    ADD COLUMN IF NOT EXISTS base_model_id String DEFAULT '',
    ADD COLUMN IF NOT EXISTS tokenizer_hash String DEFAULT '';
