"""`agentstream bench console`: time to first render of the console's trajectory pages with
`--trajectories` (default 100,000) trajectories in ClickHouse. Target: under 300 ms server time at p95.

- workload.py: the data (a fresh chDB directory, migrated, filled with generated trajectories and one
  long trajectory whose page is timed);
- measure.py: the console in a thread of this process, the pages timed (cold, then warm requests)
  and each query behind them alone;
- benchmark.py: the options, the run and the report's notes (what `infra.commands.bench` calls).
"""
