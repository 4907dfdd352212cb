"""The rollout driver: agents acting on an environment's tasks against a policy endpoint, recorded
as they go (`agentstream rollout`)."""
