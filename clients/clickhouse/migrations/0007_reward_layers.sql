-- Reward layers on trajectory.scored (issue #17, schema 1.2; docs/reward-definitions.md):
-- reward_definition: the layers every step has + the reward version, e.g. 'rules+judge@assembly-1+rules-1'
--   (the trainer never puts two definitions in one GRPO group or DPO pair); for trajectories scored
--   before 1.2 the sink writes the definition their step scores imply.
-- step_layers: per step (in step order, like step_process_scores) the layers with a signal.
-- step_missing_layers: per step, the expected layers without a signal -> why (e.g. judge ->
--   'failed (error): timeout', or 'pending (budget_paused until ...); given up after the 120s wait').
-- missing_layers: layer -> number of steps missing it (for WHERE missing_layers['judge'] > 0).

ALTER TABLE agentstream.trajectories
    ADD COLUMN IF NOT EXISTS reward_definition LowCardinality(String) DEFAULT '',
    ADD COLUMN IF NOT EXISTS step_layers Array(Array(String)) DEFAULT [],
    ADD COLUMN IF NOT EXISTS step_missing_layers Array(Map(String, String)) DEFAULT [],
    ADD COLUMN IF NOT EXISTS missing_layers Map(String, UInt32) DEFAULT map();
