-- Analytics views. They read the deduplicated tables (FINAL), so a replay never changes them.
-- (An insert-time materialized view would aggregate replayed rows twice; these views are exact.)

-- One row per episode with its outcome and its reward: the trajectory's total reward (latest
-- revision) when it has been scored, else the episode's own score.
CREATE VIEW IF NOT EXISTS agentstream.episode_outcomes AS
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
    coalesce(t.total_reward, e.score) AS reward
FROM (SELECT * FROM agentstream.episodes FINAL) AS e
LEFT JOIN (SELECT * FROM agentstream.trajectories FINAL) AS t ON e.trajectory_id = t.trajectory_id
SETTINGS join_use_nulls = 1;

CREATE VIEW IF NOT EXISTS agentstream.leaderboard AS
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
    avg(total_steps) AS mean_steps
FROM agentstream.episode_outcomes
WHERE success IS NOT NULL
GROUP BY domain, agent, model, policy_version, day;

CREATE VIEW IF NOT EXISTS agentstream.tool_usage AS
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
LEFT JOIN (SELECT * FROM agentstream.rule_rewards FINAL) AS r
    ON s.trajectory_id = r.trajectory_id AND s.step_index = r.step_index
GROUP BY tool, model
SETTINGS join_use_nulls = 1;

CREATE VIEW IF NOT EXISTS agentstream.reward_by_step AS
SELECT
    r.domain AS domain,
    r.step_index AS step_index,
    count() AS steps,
    avg(r.score) AS mean_rule_score,
    avg(r.redundancy) AS mean_redundancy,
    avg(r.regression) AS mean_regression,
    avg(r.info_utilization) AS mean_info_utilization,
    avg(j.score) AS mean_judge_score
FROM (SELECT * FROM agentstream.rule_rewards FINAL) AS r
LEFT JOIN (SELECT trajectory_id, step_index, avg(score) AS score FROM agentstream.judge_scores FINAL
           WHERE kind = 'step' GROUP BY trajectory_id, step_index) AS j
    ON r.trajectory_id = j.trajectory_id AND r.step_index = j.step_index
GROUP BY domain, step_index
SETTINGS join_use_nulls = 1;

