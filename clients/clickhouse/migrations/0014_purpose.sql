-- Why an episode was run (issue #38, schema 1.5): `purpose` is 'train' (rollouts, any agent) or 'eval'
-- (`agentstream eval`), on episode.started and trajectory.scored; batch builders train on 'train'
-- episodes only. `episodes` fills it from the start half of an episode; a row written before 1.5 keeps
-- NULL there (readers take it as 'train', what it was treated as). `trajectories` defaults to 'train'.

ALTER TABLE agentstream.episodes
    ADD COLUMN IF NOT EXISTS purpose SimpleAggregateFunction(any, Nullable(String));

ALTER TABLE agentstream.trajectories
    ADD COLUMN IF NOT EXISTS purpose LowCardinality(String) DEFAULT 'train';
