-- An episode may end more than once, each time longer (docs/otlp.md: step spans after their root
-- span end the episode again with a larger total_steps): keep the largest count and the latest end.
ALTER TABLE agentstream.episodes
    MODIFY COLUMN IF EXISTS total_steps SimpleAggregateFunction(max, Nullable(UInt32)),
    MODIFY COLUMN IF EXISTS ended_at SimpleAggregateFunction(max, Nullable(DateTime64(3, 'UTC')));
