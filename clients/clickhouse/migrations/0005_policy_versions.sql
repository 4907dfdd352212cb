-- One row per policy version (issue #15), from `policy.updated`: its parent, the update's metrics
-- and its lineage (batches, source topic/partition/offset ranges, trajectories, the versions that
-- sampled the data). ReplacingMergeTree(occurred_at) on policy_version: a re-published event (the
-- executor restarted between checkpoint and publish) replaces the row instead of adding one; read
-- with FINAL. `agentstream lineage VERSION` walks from here to batches, trajectories and steps.
-- `trajectories` and the `leaderboard` view already carry policy_version (0001, 0002).

CREATE TABLE IF NOT EXISTS agentstream.policy_versions
(
    policy_version String,
    previous_version Nullable(String),
    event_id String,
    occurred_at DateTime64(3, 'UTC'),
    method LowCardinality(String),
    step UInt32,
    base_model String,
    checkpoint_path String,
    batch_ids Array(String),
    trajectory_ids Array(String),
    behaviour_versions Array(String),
    source_ranges String,
    staleness_histogram Map(String, UInt32),
    dropped_groups UInt32,
    metrics Map(String, Float64),
    loss Nullable(Float64),
    is_ratio_mean Nullable(Float64),
    is_ratio_max Nullable(Float64),
    ess Nullable(Float64),
    clipped_fraction Nullable(Float64),
    kl Nullable(Float64)
)
ENGINE = ReplacingMergeTree(occurred_at)
ORDER BY policy_version;

-- Per policy version that sampled episodes: how they went (latest revision of each trajectory).
CREATE VIEW IF NOT EXISTS agentstream.policy_version_stats AS
SELECT
    ifNull(policy_version, '') AS policy_version,
    count() AS episodes,
    countIf(success IS NOT NULL) AS judged,
    avg(success) AS success_rate,
    avg(total_reward) AS mean_total_reward,
    min(occurred_at) AS first_seen,
    max(occurred_at) AS last_seen
FROM agentstream.trajectories FINAL
GROUP BY policy_version;
