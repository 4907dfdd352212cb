-- Small parts in one file (docs/benchmarks.md, "Third pass"). A metadata change: parts already
-- written keep their storage until merged.
--
-- Every insert of the sink writes a new part per table, and a part in ClickHouse's default "Full"
-- storage is a directory of about ten files (data, marks, index, checksums, columns, count, ...).
-- Creating (and, after merges, deleting) those files was the largest single cost of the sink's chDB
-- threads at 1,000 steps/s: kernel time allocating inodes. "Packed" storage writes a small part's files
-- into one archive, `data.packed`, read back like the separate files. Parts below 10 MiB
-- uncompressed (the Compact/Wide threshold) are packed; merges into larger parts write Full storage.
--
-- Compatibility: packed storage was open-sourced in ClickHouse 26 (chDB 4.4 runs 26.9). Once a table
-- has packed parts, a ClickHouse without it cannot read them; earlier servers know the setting as a
-- Cloud-only one and keep writing Full storage. Set it back with
-- `MODIFY SETTING min_bytes_for_full_part_storage = 0` (parts are rewritten as Full when merged).
ALTER TABLE agentstream.events MODIFY SETTING min_bytes_for_full_part_storage = 10485760;
ALTER TABLE agentstream.episodes MODIFY SETTING min_bytes_for_full_part_storage = 10485760;
ALTER TABLE agentstream.steps MODIFY SETTING min_bytes_for_full_part_storage = 10485760;
ALTER TABLE agentstream.rule_rewards MODIFY SETTING min_bytes_for_full_part_storage = 10485760;
ALTER TABLE agentstream.judge_scores MODIFY SETTING min_bytes_for_full_part_storage = 10485760;
ALTER TABLE agentstream.annotations MODIFY SETTING min_bytes_for_full_part_storage = 10485760;
ALTER TABLE agentstream.trajectories MODIFY SETTING min_bytes_for_full_part_storage = 10485760;
ALTER TABLE agentstream.trajectory_versions_seen MODIFY SETTING min_bytes_for_full_part_storage = 10485760;
ALTER TABLE agentstream.batches MODIFY SETTING min_bytes_for_full_part_storage = 10485760;
