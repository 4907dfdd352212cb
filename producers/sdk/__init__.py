"""The agent telemetry SDK: `AgentRecorder` and `AsyncAgentRecorder` (`recorder`), the pure
episode builder (`episode`), the buffer and writer/delivery threads (`pipeline`) and the fsynced
local spool with its delivery cursor (`spool`, `spool_cursor`), delivery from the spool to Kafka
(`delivery`) and the current policy for `follow_policy` (`policy_follower`).

Users import from `producers` (`from producers import AgentRecorder`); this package holds no
re-exports so that each name has one home.
"""
