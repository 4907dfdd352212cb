-- The evaluation gate's decision on each version (issue #38, schema 1.5): `policy.updated` carries
-- `gate` ('' = no gate ran, 'accepted', 'refused') and `gate_figures` (held-out episodes, both
-- versions' successes and rates, discordant pairs, the one-sided McNemar p, alpha, the serving
-- version's number). A refused version keeps its row (it stays in the lineage); it is never served.
-- Versions written before keep '' and an empty map.

ALTER TABLE agentstream.policy_versions
    ADD COLUMN IF NOT EXISTS gate LowCardinality(String) DEFAULT '',
    ADD COLUMN IF NOT EXISTS gate_figures Map(String, Float64);
