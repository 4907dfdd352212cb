"""The dataset card: `README.md` of an export, Hugging Face style (a YAML header, then prose).

The YAML header's `configs` lists each split's files, which is what makes `datasets.load_dataset(DIR)`
find the splits whatever the format; the body says what a person needs to trust the data: counts per
split, the kind, how the reward is defined and which versions scored it, the policy versions that
produced the trajectories, where in the log it came from, and when and how it was made. The same
facts are written as `export.json` for programs. Pure: facts in, text out.
"""

from __future__ import annotations

import json
from typing import Any

REWARD_DEFINITION = (
    "The reward of a trajectory is its `total_reward` from `trajectory.scored` (the assembler's "
    "combination of the outcome, process and efficiency layers, each from rules, the LLM judge and "
    "human labels where present), else its `outcome_score`, else success as 1 / 0 "
    "(`consumers.batching.builders.common.reward_of`); a trajectory without any is not exported."
)

KIND_NOTES = {
    "sft": "TRL conversational SFT rows: `messages` (+ `tools`); assistant turns carry the thought "
    "and an OpenAI-style tool call, observations are `tool` turns.",
    "dpo": "TRL preference rows `prompt` / `chosen` / `rejected` (conversational): two whole "
    "trajectories of one task, the higher reward chosen, margin in `margin`.",
    "dpo_step": "TRL preference rows: the shared history is the `prompt`, `chosen` / `rejected` "
    "are the single assistant turns where two trajectories of one task diverged.",
    "grpo": "GRPO rows: `prompt` (conversational) for TRL's GRPOTrainer, and per trajectory its "
    "`completion`, `reward`, `advantage` (within its task group), `group_id`.",
}


def _yaml(value: Any) -> str:
    """A YAML scalar (JSON strings are valid YAML)."""
    return json.dumps(value)


def card_header(facts: dict[str, Any]) -> str:
    """The YAML header: name, tags and the `configs` that map splits to files."""
    lines = [
        "---",
        f"pretty_name: {_yaml('agentstream ' + facts['kind'] + ' export')}",
        "tags:",
        *(f"- {_yaml(t)}" for t in ("agentstream", facts["kind"], "trl")),
        "task_categories:",
        "- text-generation",
        "configs:",
        "- config_name: default",
        "  data_files:",
    ]
    for split, info in facts["splits"].items():
        if info["files"]:
            lines += [f"  - split: {split}", "    path:", *(f"    - {_yaml(f)}" for f in info["files"])]
    return "\n".join([*lines, "---", ""])


def render_card(facts: dict[str, Any]) -> str:
    """The whole `README.md`.

    >>> facts = {"kind": "sft", "source": "clickhouse", "format": "jsonl", "created_at": "2026-11-25",
    ...     "splits": {"train": {"rows": 3, "tasks": 2, "files": ["train.jsonl"]}}, "seed": 0,
    ...     "fractions": [0.8, 0.1, 0.1], "reward_versions": ["rules-1"], "policy_versions": ["v1"],
    ...     "calibration_versions": [], "source_offsets": {}, "batch_ids": [], "builder_config": {},
    ...     "trajectories": 3, "command": "agentstream export --kind sft"}
    >>> "| train | 3 | 2 |" in render_card(facts)
    True
    """
    total = sum(info["rows"] for info in facts["splits"].values())
    body = [
        f"# agentstream {facts['kind']} dataset",
        "",
        KIND_NOTES[facts["kind"]],
        "",
        f"{total} rows from {facts['trajectories']} trajectories, exported from {facts['source']} "
        f"as {facts['format']} on {facts['created_at']}.",
        "",
        "## Splits",
        "",
        "| split | rows | tasks |",
        "| --- | --- | --- |",
        *(f"| {s} | {i['rows']} | {i['tasks']} |" for s, i in facts["splits"].items()),
        "",
        f"Split by task: sha256(`{facts['seed']}:<task_id>`) cut at the fractions "
        f"{', '.join(str(f) for f in facts['fractions'])} (train, validation, test), so every row of a "
        "task is in one split, and stays there in every export with the same seed.",
        "",
        *_reward_section(facts),
        *_source_section(facts),
    ]
    return card_header(facts) + "\n" + "\n".join(body) + "\n"


def _reward_section(facts: dict[str, Any]) -> list[str]:
    return [
        "## Reward",
        "",
        REWARD_DEFINITION,
        "",
        f"- reward versions: {_listed(facts['reward_versions'])}",
        f"- reward definitions (layers every step has @ version; a pair or group never mixes two): "
        f"{_listed(facts.get('reward_definitions', []))}",
        f"- calibration versions: {_listed(facts['calibration_versions'])}",
        f"- policy versions: {_listed(facts['policy_versions'])}",
        "",
    ]


def _source_section(facts: dict[str, Any]) -> list[str]:
    lines = ["## Source", ""]
    offsets = facts["source_offsets"]
    if offsets:
        lines += ["Next offset covered, per topic and partition:", ""]
        lines += [
            f"- `{topic}` partition {p}: {o}" for topic in sorted(offsets) for p, o in offsets[topic].items()
        ]
        lines.append("")
    if facts["batch_ids"]:
        lines += [f"Batches: {', '.join(f'`{b}`' for b in facts['batch_ids'])}", ""]
    lines += [
        "## How it was made",
        "",
        f"`{facts['command']}`",
        "",
        "Builder configuration:",
        "",
        "```json",
        json.dumps(facts["builder_config"], indent=2, sort_keys=True),
        "```",
        "",
        "Check it with `agentstream export --validate DIR` (schema, empty messages, leakage between "
        "splits, duplicate rows).",
    ]
    return lines


def _listed(values: list[str]) -> str:
    return ", ".join(f"`{v}`" for v in values) if values else "none recorded"
