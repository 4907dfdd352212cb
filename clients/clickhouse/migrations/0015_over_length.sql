-- Rows over --max-length (issue #38, schema 1.5): the executor leaves a row (a DPO pair with either
-- side) longer than --max-length out of the update instead of cutting it, and counts it in
-- `policy.updated`'s metrics (`rows_over_max_length`, `tokens_over_max_length`). The row count is a
-- column so a lineage query can find versions that lost rows; versions written before keep 0.

ALTER TABLE agentstream.policy_versions
    ADD COLUMN IF NOT EXISTS rows_over_max_length UInt32 DEFAULT 0;
