-- Reward versions side by side (issue #17, docs/reward-versions.md). A replay under a new rule version
-- (`agentstream replay --reward-version rules-2`) scores the same trajectories again: the assembler
-- stamps 'assembly-1+rules-2' beside the live 'assembly-1+rules-1'. Both must stay queryable, so
-- `trajectories` keeps one row per (trajectory, reward version), the latest revision of each.
--
-- Every statement may run again after an interruption: ADD COLUMN IF NOT EXISTS, CREATE ... IF NOT
-- EXISTS, and CREATE OR REPLACE (the table copy reads the table it replaces, so a second run copies
-- the already-migrated rows into an identical table). The copy is one atomic swap (new table, copy,
-- exchange, drop the old one); rows inserted into the old table while it copies would be lost, so it
-- runs where migrations run: when the sink (or `agentstream db migrate`) starts, before it consumes.

-- ingested_at: when the sink last wrote the row (a replay of the same version writes it again).
-- Rows written before this migration take their occurred_at.
ALTER TABLE agentstream.trajectories
    ADD COLUMN IF NOT EXISTS ingested_at DateTime64(3, 'UTC') DEFAULT occurred_at;

CREATE OR REPLACE TABLE agentstream.trajectories
(
    trajectory_id String,
    revision UInt32,
    event_id String,
    occurred_at DateTime64(3, 'UTC'),
    task_id String,
    task String,
    domain LowCardinality(String),
    agent LowCardinality(String),
    model LowCardinality(String),
    policy_version Nullable(String),
    group_id Nullable(String),
    success Nullable(UInt8),
    total_steps UInt32,
    outcome_score Nullable(Float64),
    process_score Nullable(Float64),
    efficiency_score Nullable(Float64),
    total_reward Nullable(Float64),
    complete UInt8,
    missing Array(String),
    reward_version LowCardinality(String),
    calibration_version Nullable(String),
    started_at Nullable(DateTime64(3, 'UTC')),
    ended_at Nullable(DateTime64(3, 'UTC')),
    step_process_scores Array(Nullable(Float64)),
    steps String CODEC(ZSTD(3)),
    metadata String,
    reward_definition LowCardinality(String) DEFAULT '',
    step_layers Array(Array(String)) DEFAULT [],
    step_missing_layers Array(Map(String, String)) DEFAULT [],
    missing_layers Map(String, UInt32) DEFAULT map(),
    ingested_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree(revision)
ORDER BY (trajectory_id, reward_version)
AS SELECT
    trajectory_id, revision, event_id, occurred_at, task_id, task, domain, agent, model, policy_version,
    group_id, success, total_steps, outcome_score, process_score, efficiency_score, total_reward,
    complete, missing, reward_version, calibration_version, started_at, ended_at, step_process_scores,
    steps, metadata, reward_definition, step_layers, step_missing_layers, missing_layers, ingested_at
FROM agentstream.trajectories;

-- When each trajectory reward version was first written: the sink adds a row per trajectory.scored
-- and the table keeps the smallest time, so writing a version again (a replay of the live version)
-- never moves it. Filled here from the rows already there. The first version written is the live
-- one: what the live assembler stamps.
CREATE TABLE IF NOT EXISTS agentstream.trajectory_versions_seen
(
    reward_version String,
    first_seen SimpleAggregateFunction(min, DateTime64(3, 'UTC')) DEFAULT now64(3)
)
ENGINE = AggregatingMergeTree
ORDER BY reward_version
AS SELECT toString(reward_version) AS reward_version, min(ingested_at) AS first_seen
FROM agentstream.trajectories
GROUP BY reward_version;

-- The registry: one row per completed replay version (`reward.version.completed` on the
-- `reward.versions` topic, published by `agentstream replay` when it finishes). A version replayed
-- again keeps its latest completion.
CREATE TABLE IF NOT EXISTS agentstream.reward_versions
(
    version String,
    event_id String,
    occurred_at DateTime64(3, 'UTC'),
    roles Array(String),
    source_end_offsets String,
    since Nullable(DateTime64(3, 'UTC')),
    started_at DateTime64(3, 'UTC'),
    completed_at DateTime64(3, 'UTC'),
    app_id String,
    producer LowCardinality(String)
)
ENGINE = ReplacingMergeTree(completed_at)
ORDER BY version;

-- Every reward version in `trajectories`: how many trajectories, when first seen and last written,
-- the completed replay of its rules version (if any), `live` (the first version seen: what the live
-- assembler stamps) and `complete` (live, or a completed replay). Rows inserted without the sink
-- (no trajectory_versions_seen row) count as first seen when first written.
CREATE OR REPLACE VIEW agentstream.trajectory_versions AS
SELECT
    v.reward_version AS reward_version,
    v.rules_version AS rules_version,
    v.trajectories AS trajectories,
    v.first_seen AS first_seen,
    v.last_seen AS last_seen,
    r.completed_at AS completed_at,
    r.roles AS replay_roles,
    toUInt8(v.reward_version = argMin(v.reward_version, (v.first_seen, v.reward_version)) OVER ()) AS live,
    toUInt8(live OR r.completed_at IS NOT NULL) AS complete
FROM
(
    SELECT
        t.reward_version AS reward_version,
        t.rules_version AS rules_version,
        t.trajectories AS trajectories,
        ifNull(s.first_seen, t.first_written) AS first_seen,
        t.last_seen AS last_seen
    FROM
    (
        SELECT
            toString(reward_version) AS reward_version,
            if(position(reward_version, '+') > 0, substring(reward_version, position(reward_version, '+') + 1),
               toString(reward_version)) AS rules_version,
            uniqExact(trajectory_id) AS trajectories,
            min(ingested_at) AS first_written,
            max(ingested_at) AS last_seen
        FROM agentstream.trajectories
        GROUP BY reward_version
    ) AS t
    LEFT JOIN
    (
        SELECT reward_version, min(first_seen) AS first_seen
        FROM agentstream.trajectory_versions_seen
        GROUP BY reward_version
    ) AS s ON t.reward_version = s.reward_version
) AS v
LEFT JOIN (SELECT version, completed_at, roles FROM agentstream.reward_versions FINAL) AS r
    ON v.rules_version = r.version
SETTINGS join_use_nulls = 1;

-- The newest complete version: the one of the latest completed replay that has trajectories, else
-- the live one. Always one row ('' while there are no trajectories).
CREATE OR REPLACE VIEW agentstream.reward_version_default AS
SELECT
    toString(any(reward_version)) AS reward_version,
    toString(any(rules_version)) AS rules_version,
    any(completed_at) AS completed_at
FROM
(
    SELECT reward_version, rules_version, completed_at
    FROM agentstream.trajectory_versions
    WHERE complete
    ORDER BY isNull(completed_at), completed_at DESC, first_seen, reward_version
    LIMIT 1
);

-- One row per episode with its outcome and its reward under one reward version:
-- SELECT * FROM agentstream.episode_outcomes_at(reward_version = 'assembly-1+rules-2').
-- An episode that version did not score keeps its own score as `reward` (reward_version NULL).
CREATE OR REPLACE VIEW agentstream.episode_outcomes_at AS
SELECT
    e.trajectory_id AS trajectory_id,
    coalesce(e.domain, t.domain, 'generic') AS domain,
    coalesce(e.agent, t.agent, '') AS agent,
    coalesce(e.model, t.model, '') AS model,
    coalesce(e.policy_version, t.policy_version, '') AS policy_version,
    coalesce(e.task_id, t.task_id, '') AS task_id,
    coalesce(e.group_id, t.group_id) AS group_id,
    e.started_at AS started_at,
    e.ended_at AS ended_at,
    toDate(coalesce(e.started_at, e.ended_at, t.started_at)) AS day,
    toNullable(toUInt8(coalesce(e.success, t.success))) AS success,
    e.score AS score,
    coalesce(e.total_steps, t.total_steps) AS total_steps,
    t.total_reward AS total_reward,
    t.outcome_score AS outcome_score,
    t.process_score AS process_score,
    t.efficiency_score AS efficiency_score,
    coalesce(t.total_reward, e.score) AS reward,
    t.reward_version AS reward_version
FROM (SELECT * FROM agentstream.episodes FINAL) AS e
LEFT JOIN
(
    SELECT * FROM agentstream.trajectories FINAL WHERE reward_version = {reward_version:String}
) AS t ON e.trajectory_id = t.trajectory_id
SETTINGS join_use_nulls = 1;

-- The same under the newest complete version (what `episode_outcomes` always meant: one row per episode).
CREATE OR REPLACE VIEW agentstream.episode_outcomes AS
SELECT * FROM agentstream.episode_outcomes_at(
    reward_version = (SELECT reward_version FROM agentstream.reward_version_default)
);

CREATE OR REPLACE VIEW agentstream.leaderboard_at AS
SELECT
    domain,
    agent,
    model,
    policy_version,
    day,
    count() AS episodes,
    sum(success) AS successes,
    avg(success) AS success_rate,
    count(reward) AS rewarded,
    avg(reward) AS mean_reward,
    stddevSamp(reward) AS std_reward,
    min(reward) AS min_reward,
    max(reward) AS max_reward,
    quantile(0.5)(reward) AS p50_reward,
    quantile(0.9)(reward) AS p90_reward,
    avg(total_steps) AS mean_steps,
    {reward_version:String} AS reward_version
FROM agentstream.episode_outcomes_at(reward_version = {reward_version:String})
WHERE success IS NOT NULL
GROUP BY domain, agent, model, policy_version, day;

-- The same columns as before 0009 (leaderboard_snapshot copies them); the version it shows is
-- agentstream.reward_version_default.
CREATE OR REPLACE VIEW agentstream.leaderboard AS
SELECT * EXCEPT (reward_version) FROM agentstream.leaderboard_at(
    reward_version = (SELECT reward_version FROM agentstream.reward_version_default)
);

-- Rule rewards of the default version's rules (every version while nothing is scored yet).
CREATE OR REPLACE VIEW agentstream.tool_usage AS
SELECT
    s.tool AS tool,
    s.model AS model,
    count() AS calls,
    countIf(s.error IS NOT NULL OR ifNull(s.exit_code, 0) != 0) AS errors,
    errors / calls AS error_rate,
    avg(s.latency_ms) AS mean_latency_ms,
    avg(r.score) AS mean_rule_score,
    avg(r.redundancy) AS mean_redundancy
FROM (SELECT * FROM agentstream.steps FINAL) AS s
LEFT JOIN
(
    SELECT * FROM agentstream.rule_rewards FINAL
    WHERE (SELECT rules_version FROM agentstream.reward_version_default) = ''
       OR reward_version = (SELECT rules_version FROM agentstream.reward_version_default)
) AS r ON s.trajectory_id = r.trajectory_id AND s.step_index = r.step_index
GROUP BY tool, model
SETTINGS join_use_nulls = 1;

CREATE OR REPLACE VIEW agentstream.reward_by_step AS
SELECT
    r.domain AS domain,
    r.step_index AS step_index,
    count() AS steps,
    avg(r.score) AS mean_rule_score,
    avg(r.redundancy) AS mean_redundancy,
    avg(r.regression) AS mean_regression,
    avg(r.info_utilization) AS mean_info_utilization,
    avg(j.score) AS mean_judge_score
FROM
(
    SELECT * FROM agentstream.rule_rewards FINAL
    WHERE (SELECT rules_version FROM agentstream.reward_version_default) = ''
       OR reward_version = (SELECT rules_version FROM agentstream.reward_version_default)
) AS r
LEFT JOIN (SELECT trajectory_id, step_index, avg(score) AS score FROM agentstream.judge_scores FINAL
           WHERE kind = 'step' GROUP BY trajectory_id, step_index) AS j
    ON r.trajectory_id = j.trajectory_id AND r.step_index = j.step_index
GROUP BY domain, step_index
SETTINGS join_use_nulls = 1;

-- Per policy version: how its episodes went, under the default reward version.
CREATE OR REPLACE VIEW agentstream.policy_version_stats AS
SELECT
    ifNull(policy_version, '') AS policy_version,
    count() AS episodes,
    countIf(success IS NOT NULL) AS judged,
    avg(success) AS success_rate,
    avg(total_reward) AS mean_total_reward,
    min(occurred_at) AS first_seen,
    max(occurred_at) AS last_seen
FROM agentstream.trajectories FINAL
WHERE reward_version = (SELECT reward_version FROM agentstream.reward_version_default)
GROUP BY policy_version;
