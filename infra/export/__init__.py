"""`agentstream export`: SFT / DPO / GRPO datasets with train / validation / test splits by task.

The API (stable; the CLI and the MCP server's `export_dataset` tool call these two functions):

    from infra.export.run import export_dataset, validate_dataset

    summary = export_dataset(
        client_or_url,          # a clickhouse-connect client, a ClickHouse URL, or None (batches)
        kind,                   # "sft" | "dpo" | "dpo_step" | "grpo"
        source,                 # "clickhouse" (scored trajectories) | "batches" (the trainer's files)
        fmt,                    # "jsonl" | "parquet" | "hf"
        out_dir,                # str | Path; created; an earlier export there is replaced (any
                                #   other non-empty directory is refused)
        *,
        data_dir=None,          # where `batches/<kind>/` lives (source="batches")
        split=(0.8, 0.1, 0.1),  # fractions of train / validation / test, or "0.8,0.1,0.1"
        seed=0,                 # the split salt: same seed, same task -> same split, every export
        reward_versions=(),     # only trajectories / batches scored with these reward versions
        min_reward=None,        # SFT: only trajectories with at least this reward
        require_success=True,   # SFT: only successful trajectories
        progress=None,          # callable(str) for progress lines (the CLI prints them)
    ) -> dict
    # {"out_dir", "kind", "source", "format", "rows", "splits": {"train": n, ...},
    #  "tasks": {"train": n, ...}, "files": [...], "reward_versions": [...], "policy_versions": [...],
    #  "problems": [...]}  (problems: what `validate_dataset` found in what was written; empty = ok)

    report = validate_dataset(out_dir) -> dict
    # {"ok": bool, "kind", "splits": {"train": n, ...},
    #  "problems": [{"split": "test", "row": 3, "reason": "leak: task 'k' is also in train"}, ...]}

Both raise `infra.export.errors.ExportError` (an `InfraError`) with a one-line message naming the
option or file.

Modules: `config.py` (the options, one dataclass), `splits.py` (pure: task -> split), `rows.py`
(pure: trajectories -> rows through the trainer's builders), `checks.py` (pure: the validator),
`card.py` (pure: the dataset card), `sources.py` (I/O: ClickHouse and batch files), `files.py` (I/O:
writing and reading the split files), `run.py` (the two functions above). Nothing here imports
torch; pyarrow is imported where Parquet is written or read.
"""
