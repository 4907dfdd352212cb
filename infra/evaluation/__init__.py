"""Evaluation statistics and the paired comparison of policies (pure: plain values in, figures out).

`stats` holds the tests (exact McNemar, paired bootstrap, Holm, pass@k, Wilson); `outcomes` holds the
per-episode record (`Outcome`) that both evaluation paths produce, `agentstream eval` over policy
endpoints and `infra.learn.heldout.evaluate` in-process, with the per-policy summary and the pairwise
comparison built on it. Nothing here plays an episode, records an event or reads the clock.

Pairs are the same task and the same sample index (hence the same sampling seed) under two policies;
greedy episodes (temperature 0, one per task) are kept apart from sampled ones.
"""
