"""Judge rules: which trajectories the LLM judge scores, how (per step, trajectory or group), at what rate.

A rules file (YAML or JSON) holds an ordered list; the first rule whose filters match an
`episode.started` event decides. Sampling is deterministic by trajectory id (a hash mapped to
[0, 1) and compared with the rule's rate), so a restarted worker makes the same choice and other
evaluators can co-sample by using the same salt.

This module is pure: it reads a file only in `JudgeRules.load`, and never talks to Kafka or a model.
The judge without a rules file uses `DEFAULT_RULES` (every trajectory, judged as a whole;
`JudgeRules.for_judge`); `JudgeRules.load` alone gives no rules then (the assembler's reading: no
file, no judge scores expected). A rules file given that does not exist is a `JudgeRulesError`
naming the path, for both. A file with an empty list judges nothing.

Example rules file::

    rules:
      - name: coding-steps
        domains: [coding]
        mode: step
        rate: 0.25
        batch_steps: 4
      - name: grpo-groups
        mode: group
        agents: [rollout-bot]

>>> rules = JudgeRules(rules=[JudgeRule(name="all", mode="trajectory", rate=1.0)])
>>> from datetime import UTC, datetime
>>> from schemas.events import EpisodeStarted
>>> ev = EpisodeStarted(event_id="e", trajectory_id="t1", occurred_at=datetime.now(UTC),
...                     producer="doc", task_id="k")
>>> rules.mode_for(ev)
'trajectory'
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.events import EpisodeStarted
from streams.errors import JudgeRulesError, option_file

JudgeMode = Literal["step", "trajectory", "group"]


def sample_fraction(trajectory_id: str, salt: str = "") -> float:
    """A stable number in [0, 1) for a trajectory id (sha256, first 8 bytes).

    >>> sample_fraction("t1") == sample_fraction("t1")
    True
    >>> 0.0 <= sample_fraction("t1", "salt") < 1.0
    True
    """
    digest = hashlib.sha256(f"{salt}\x1f{trajectory_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _matches(allowed: list[str] | None, value: str) -> bool:
    return allowed is None or value in allowed


class JudgeRule(BaseModel):
    """One rule. A filter left out (None) matches anything."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "default"
    domains: list[str] | None = None
    agents: list[str] | None = None
    models: list[str] | None = None
    mode: JudgeMode = "step"
    rate: float = Field(1.0, ge=0.0, le=1.0, description="fraction of matching trajectories judged")
    salt: str = Field("", description="sampling salt; rules sharing a salt co-sample")
    batch_steps: int = Field(1, ge=1, le=64, description="step mode: steps of one trajectory per call")
    rubrics: list[str] | None = Field(None, description="rubric ids to use instead of the domain's set")
    context_steps: int = Field(5, ge=0, le=50, description="recent steps shown as context")
    group_size: int | None = Field(
        None,
        ge=1,
        description="group mode: judge a group once this many members ended "
        "(else metadata.group_size, else after the quiet period)",
    )

    def matches(self, started: EpisodeStarted) -> bool:
        """Whether the filters match this episode (sampling not applied)."""
        return (
            _matches(self.domains, started.domain)
            and _matches(self.agents, started.agent)
            and _matches(self.models, started.model)
        )

    def sampled(self, trajectory_id: str) -> bool:
        """Whether this trajectory falls inside the rule's sample."""
        return sample_fraction(trajectory_id, self.salt) < self.rate


class JudgeRules(BaseModel):
    """The ordered rule list. No rules: nothing is judged."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rules: list[JudgeRule] = Field(default_factory=list)

    @classmethod
    def for_judge(cls, path: str | Path | None) -> JudgeRules:
        """The judge's rules: the file's when one is given (errors as in `load`), else `DEFAULT_RULES`.

        >>> [r.name for r in JudgeRules.for_judge(None).rules]
        ['all-trajectories']
        """
        found = option_file(path, "judge rules file", JudgeRulesError)
        return DEFAULT_RULES if found is None else cls.load(found)

    @classmethod
    def load(cls, path: str | Path | None) -> JudgeRules:
        """Rules from a YAML or JSON file. No path given (None or empty) gives no rules; a path given
        that does not exist raises JudgeRulesError naming it (a typo must not silently judge nothing)."""
        found = option_file(path, "judge rules file", JudgeRulesError)
        if found is None:
            return cls()
        try:
            raw = _parse_text(found.read_text(), found.suffix.lower())
        except (OSError, ValueError) as exc:
            raise JudgeRulesError(f"judge rules file {found}: {exc}") from None
        if isinstance(raw, list):
            raw = {"rules": raw}
        try:
            return cls.model_validate(raw or {})
        except ValueError as exc:
            raise JudgeRulesError(f"judge rules file {found}: {exc}") from None

    def rule_for(self, started: EpisodeStarted) -> JudgeRule | None:
        """The first rule whose filters match, if the trajectory is in its sample; else None."""
        for rule in self.rules:
            if rule.matches(started):
                return rule if rule.sampled(started.trajectory_id) else None
        return None

    def mode_for(self, started: EpisodeStarted) -> JudgeMode | None:
        """How this trajectory is judged, or None when it is not."""
        rule = self.rule_for(started)
        return rule.mode if rule else None


DEFAULT_RULE = JudgeRule(name="all-trajectories", mode="trajectory", rate=1.0)
"""The rule the judge uses when no rules file is configured: every trajectory, judged as a whole.

Why this default: turning the judge on (giving it a key) should judge something, and "trajectory"
is the mode that asks least of the stream and the budget: one call per trajectory once its
`episode.ended` arrives (step mode makes one call per step batch; group mode waits for groups),
with the domain's rubric set. It matches every domain, agent and model and samples all of them.

To narrow it, write a rules file (`AGENTSTREAM_JUDGE_RULES_PATH` / `--judge-rules`) starting from
this rule: filter by `domains`, `agents` or `models`, lower `rate` to sample, or pick another `mode`
(docs/judge.md). The first matching rule decides; a trajectory no rule matches is not judged.
"""

DEFAULT_RULES = JudgeRules(rules=[DEFAULT_RULE])


def _parse_text(text: str, suffix: str) -> object:
    if suffix == ".json":
        return json.loads(text)
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None
