"""Example analytics queries, as documented in the README (tested against real data in
tests/test_sink_integration.py so the documentation cannot rot)."""

from __future__ import annotations

EXAMPLES: dict[str, str] = {
    # Which model is best on which domain (mean reward, success rate, episodes)?
    "best_model_per_domain": """
SELECT domain,
       argMax(model, mean_reward) AS best_model,
       max(mean_reward) AS best_mean_reward
FROM (
    SELECT domain, model, avg(reward) AS mean_reward, avg(success) AS success_rate, count() AS episodes
    FROM agentstream.episode_outcomes
    WHERE success IS NOT NULL
    GROUP BY domain, model
)
GROUP BY domain
ORDER BY domain""",
    # Where do agents waste steps? Steps the rule layer scored as redundant, by tool.
    "wasted_steps_by_tool": """
SELECT s.tool AS tool,
       count() AS steps,
       countIf(r.redundancy < 0.5) AS redundant_steps,
       round(redundant_steps / steps, 3) AS wasted_share
FROM agentstream.steps AS s FINAL
JOIN (
    -- one reward version's rules (the newest complete one's; every version while nothing is scored)
    SELECT * FROM agentstream.rule_rewards FINAL
    WHERE (SELECT rules_version FROM agentstream.reward_version_default) IN ('', reward_version)
) AS r
    ON s.trajectory_id = r.trajectory_id AND s.step_index = r.step_index
GROUP BY tool
ORDER BY wasted_share DESC""",
    # How does reward move over training (policy versions, in order of first use)?
    "reward_over_policy_versions": """
SELECT policy_version,
       min(started_at) AS first_seen,
       count() AS episodes,
       round(avg(reward), 4) AS mean_reward,
       round(avg(success), 4) AS success_rate
FROM agentstream.episode_outcomes
WHERE success IS NOT NULL
GROUP BY policy_version
ORDER BY first_seen""",
    # The latest revision of each trajectory under the newest complete reward version, without FINAL
    # (argMax over the version column; one row per trajectory and reward version in the table).
    "latest_revision_with_argmax": """
SELECT trajectory_id,
       max(revision) AS latest_revision,
       argMax(total_reward, revision) AS latest_total_reward
FROM agentstream.trajectories
WHERE reward_version = (SELECT reward_version FROM agentstream.reward_version_default)
GROUP BY trajectory_id
ORDER BY trajectory_id
LIMIT 10""",
}
