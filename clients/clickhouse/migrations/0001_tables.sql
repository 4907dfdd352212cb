-- Core tables. Every table is idempotent under replay: ReplacingMergeTree deduplicates rows with the
-- same ORDER BY key (event_id, or a natural key plus a version column) at merge time; read with
-- FINAL (or argMax over the version) for exact, deduplicated results. Event tables are partitioned
-- by month of occurred_at; episodes and trajectories are not partitioned by time, because rows of one
-- trajectory arrive at different times and must share a partition for deduplication to apply.

CREATE TABLE IF NOT EXISTS agentstream.events
(
    event_id String,
    type LowCardinality(String),
    schema_version LowCardinality(String),
    trajectory_id String,
    occurred_at DateTime64(3, 'UTC'),
    producer LowCardinality(String),
    topic LowCardinality(String),
    partition UInt32,
    offset UInt64,
    raw String CODEC(ZSTD(3)),
    ingested_at DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (type, trajectory_id, event_id);

-- One row per trajectory: episode.started fills the first half, episode.ended the second; `any`
-- ignores NULLs, so FINAL (or GROUP BY trajectory_id with any()) merges both halves, replay-safe.
CREATE TABLE IF NOT EXISTS agentstream.episodes
(
    trajectory_id String,
    task_id SimpleAggregateFunction(any, Nullable(String)),
    task SimpleAggregateFunction(any, Nullable(String)),
    domain SimpleAggregateFunction(any, Nullable(String)),
    agent SimpleAggregateFunction(any, Nullable(String)),
    model SimpleAggregateFunction(any, Nullable(String)),
    policy_version SimpleAggregateFunction(any, Nullable(String)),
    group_id SimpleAggregateFunction(any, Nullable(String)),
    reference_steps SimpleAggregateFunction(any, Nullable(UInt32)),
    metadata SimpleAggregateFunction(any, Nullable(String)),
    started_at SimpleAggregateFunction(any, Nullable(DateTime64(3, 'UTC'))),
    ended_at SimpleAggregateFunction(any, Nullable(DateTime64(3, 'UTC'))),
    success SimpleAggregateFunction(any, Nullable(UInt8)),
    score SimpleAggregateFunction(any, Nullable(Float64)),
    tests_passed SimpleAggregateFunction(any, Nullable(UInt32)),
    tests_failed SimpleAggregateFunction(any, Nullable(UInt32)),
    terminated SimpleAggregateFunction(any, Nullable(UInt8)),
    truncated SimpleAggregateFunction(any, Nullable(UInt8)),
    total_steps SimpleAggregateFunction(any, Nullable(UInt32)),
    error SimpleAggregateFunction(any, Nullable(String))
)
ENGINE = AggregatingMergeTree
ORDER BY trajectory_id;

CREATE TABLE IF NOT EXISTS agentstream.steps
(
    event_id String,
    trajectory_id String,
    step_index UInt32,
    occurred_at DateTime64(3, 'UTC'),
    thought String,
    tool LowCardinality(String),
    params String,
    observation String CODEC(ZSTD(3)),
    exit_code Nullable(Int64),
    error Nullable(String),
    model LowCardinality(String),
    policy_version Nullable(String),
    input_tokens Nullable(UInt32),
    output_tokens Nullable(UInt32),
    latency_ms Nullable(Float64),
    sampled_tokens UInt32,
    producer LowCardinality(String)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (trajectory_id, step_index, event_id);

CREATE TABLE IF NOT EXISTS agentstream.rule_rewards
(
    event_id String,
    trajectory_id String,
    step_index UInt32,
    occurred_at DateTime64(3, 'UTC'),
    redundancy Nullable(Float64),
    regression Nullable(Float64),
    info_utilization Nullable(Float64),
    score Nullable(Float64),
    domain LowCardinality(String),
    reward_version LowCardinality(String),
    source_event_id String
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (trajectory_id, step_index, event_id);

-- reward.judge.step (kind 'step'), reward.judge.trajectory ('trajectory'), reward.judge.failed ('failed').
CREATE TABLE IF NOT EXISTS agentstream.judge_scores
(
    event_id String,
    trajectory_id String,
    kind LowCardinality(String),
    step_index Nullable(UInt32),
    occurred_at DateTime64(3, 'UTC'),
    scores Map(String, Float64),
    score Nullable(Float64),
    rationale String,
    judge_model LowCardinality(String),
    prompt_version LowCardinality(String),
    input_tokens UInt32,
    output_tokens UInt32,
    cost_usd Float64,
    latency_ms Float64,
    cached UInt8,
    group_id Nullable(String),
    mode LowCardinality(String),
    source_event_id Nullable(String),
    failure_reason String,
    failure_kind LowCardinality(String),
    attempts UInt32
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (trajectory_id, event_id);

CREATE TABLE IF NOT EXISTS agentstream.annotations
(
    event_id String,
    trajectory_id String,
    step_index Nullable(UInt32),
    occurred_at DateTime64(3, 'UTC'),
    rubric LowCardinality(String),
    score Float64,
    annotator String,
    comment String,
    producer LowCardinality(String)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (trajectory_id, event_id);

-- Natural key trajectory_id, version `revision` (from trajectory.scored): FINAL keeps the latest.
CREATE TABLE IF NOT EXISTS agentstream.trajectories
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
    metadata String
)
ENGINE = ReplacingMergeTree(revision)
ORDER BY trajectory_id;

CREATE TABLE IF NOT EXISTS agentstream.batches
(
    batch_id String,
    event_id String,
    occurred_at DateTime64(3, 'UTC'),
    kind LowCardinality(String),
    path String,
    format LowCardinality(String),
    row_count UInt32,
    trajectory_ids Array(String),
    source_offsets String,
    reward_versions Array(String),
    calibration_versions Array(String),
    policy_versions Array(String),
    builder_config String,
    sha256 String
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (batch_id, event_id);

CREATE TABLE IF NOT EXISTS agentstream.policy_updates
(
    policy_version String,
    event_id String,
    occurred_at DateTime64(3, 'UTC'),
    previous_version Nullable(String),
    base_model String,
    checkpoint_path String,
    method LowCardinality(String),
    step UInt32,
    batch_ids Array(String),
    metrics Map(String, Float64)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (policy_version, event_id);

CREATE TABLE IF NOT EXISTS agentstream.dead_letters
(
    event_id String,
    trajectory_id String,
    occurred_at DateTime64(3, 'UTC'),
    stage LowCardinality(String),
    reason String,
    error_type LowCardinality(String),
    source_topic Nullable(String),
    source_partition Nullable(Int32),
    source_offset Nullable(Int64),
    source_key Nullable(String),
    payload String CODEC(ZSTD(3)),
    payload_encoding LowCardinality(String)
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(occurred_at)
ORDER BY (stage, event_id);
