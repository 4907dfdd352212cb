-- Materialized copies of the analytics views for dashboards: refreshable materialized views
-- recompute them from the deduplicated tables every 30 s and swap the result in atomically, so
-- they are replay-safe (unlike insert-time aggregation). The views stay exact at query time.
-- (Refreshable views are experimental before ClickHouse 24.10; the setting is ignored after.)

SET allow_experimental_refreshable_materialized_view = 1;

CREATE TABLE IF NOT EXISTS agentstream.leaderboard_snapshot
(
    domain String,
    agent String,
    model String,
    policy_version String,
    day Date,
    episodes UInt64,
    successes UInt64,
    success_rate Float64,
    rewarded UInt64,
    mean_reward Nullable(Float64),
    std_reward Nullable(Float64),
    min_reward Nullable(Float64),
    max_reward Nullable(Float64),
    p50_reward Nullable(Float64),
    p90_reward Nullable(Float64),
    mean_steps Nullable(Float64)
)
ENGINE = MergeTree
ORDER BY (domain, model, agent, policy_version, day);

CREATE MATERIALIZED VIEW IF NOT EXISTS agentstream.leaderboard_snapshot_refresh
REFRESH EVERY 30 SECOND TO agentstream.leaderboard_snapshot AS
SELECT domain, agent, model, policy_version, day, episodes, successes, success_rate, rewarded,
       mean_reward, std_reward, min_reward, max_reward, p50_reward, p90_reward, mean_steps
FROM agentstream.leaderboard;

CREATE TABLE IF NOT EXISTS agentstream.tool_usage_snapshot
(
    tool String,
    model String,
    calls UInt64,
    errors UInt64,
    error_rate Float64,
    mean_latency_ms Nullable(Float64),
    mean_rule_score Nullable(Float64),
    mean_redundancy Nullable(Float64)
)
ENGINE = MergeTree
ORDER BY (tool, model);

CREATE MATERIALIZED VIEW IF NOT EXISTS agentstream.tool_usage_refresh
REFRESH EVERY 30 SECOND TO agentstream.tool_usage_snapshot AS
SELECT tool, model, calls, errors, error_rate, mean_latency_ms, mean_rule_score, mean_redundancy
FROM agentstream.tool_usage;

CREATE TABLE IF NOT EXISTS agentstream.reward_by_step_snapshot
(
    domain String,
    step_index UInt32,
    steps UInt64,
    mean_rule_score Nullable(Float64),
    mean_redundancy Nullable(Float64),
    mean_regression Nullable(Float64),
    mean_info_utilization Nullable(Float64),
    mean_judge_score Nullable(Float64)
)
ENGINE = MergeTree
ORDER BY (domain, step_index);

CREATE MATERIALIZED VIEW IF NOT EXISTS agentstream.reward_by_step_refresh
REFRESH EVERY 30 SECOND TO agentstream.reward_by_step_snapshot AS
SELECT domain, step_index, steps, mean_rule_score, mean_redundancy, mean_regression,
       mean_info_utilization, mean_judge_score
FROM agentstream.reward_by_step;
