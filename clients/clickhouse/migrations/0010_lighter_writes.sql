-- Cheaper writes for the sink's steady stream of small inserts (docs/benchmarks.md, "e2e: where the
-- CPU goes"). Both are metadata changes: parts already written keep their codec until merged.
--
-- LZ4 (ClickHouse's default codec) instead of ZSTD(3) on the three columns holding every step's
-- observation: each insert and every merge compresses them again, and at 1,000 steps/s ZSTD(3) cost
-- the sink's chDB threads about twice LZ4's CPU. The price is disk: LZ4 keeps text about 1.6x larger.
-- An operator who prefers disk to CPU can set ZSTD back with the same statements.
ALTER TABLE agentstream.events MODIFY COLUMN IF EXISTS raw String CODEC(LZ4);
ALTER TABLE agentstream.steps MODIFY COLUMN IF EXISTS observation String CODEC(LZ4);
ALTER TABLE agentstream.trajectories MODIFY COLUMN IF EXISTS steps String CODEC(LZ4);

-- Merge more small parts at once (base 20 instead of 5): the sink adds a part per table twice a
-- second under load, and with the default base each row is merged again several times on its way to
-- a large part. Fewer, wider merges roughly halved the merge threads' CPU at 1,000 steps/s. Reads
-- see a few more parts per partition in between (FINAL merges them at query time).
ALTER TABLE agentstream.events MODIFY SETTING merge_selector_base = 20;
ALTER TABLE agentstream.episodes MODIFY SETTING merge_selector_base = 20;
ALTER TABLE agentstream.steps MODIFY SETTING merge_selector_base = 20;
ALTER TABLE agentstream.rule_rewards MODIFY SETTING merge_selector_base = 20;
ALTER TABLE agentstream.judge_scores MODIFY SETTING merge_selector_base = 20;
ALTER TABLE agentstream.annotations MODIFY SETTING merge_selector_base = 20;
ALTER TABLE agentstream.trajectories MODIFY SETTING merge_selector_base = 20;
ALTER TABLE agentstream.trajectory_versions_seen MODIFY SETTING merge_selector_base = 20;
ALTER TABLE agentstream.batches MODIFY SETTING merge_selector_base = 20;
