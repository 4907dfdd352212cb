"""Rule-based process rewards (layer 1 of the reward model): pure functions, no I/O.

Per step: `redundancy`, `regression`, `info_utilization` (each in [0, 1] or None = no signal).
Per trajectory: `efficiency` (when a reference step count is known) and `outcome`.
Semantics follow reference/seed-knowlyr-gym.md section 2.2 (`agentreward.rules`), computed
incrementally: `RuleState.score(step, profile)` updates a small serializable state (hashes, indices and the
harvested information tokens), so the stream processor can keep one state per trajectory in a table.

Worked example of the seed (coding profile), reproduced exactly:

>>> from streams.rules.profiles import CODING
>>> steps = [
...     StepInput("read_file", {"file_path": "/a.py"}, "src/util.py my_var"),
...     StepInput("read_file", {"file_path": "/a.py"}),
...     StepInput("edit_file", {"file_path": "/a.py", "old_string": "x", "new_string": "y"}),
...     StepInput("edit_file", {"file_path": "/a.py", "old_string": "y", "new_string": "x"}),
...     StepInput("read_file", {"file_path": "/a.py"}),
...     StepInput("bash", {"command": "pytest"}),
...     StepInput("bash", {"command": "pytest"}),
...     StepInput("bash", {"command": "python src/util.py"}),
... ]
>>> scores = score_steps(steps, CODING)
>>> [s.redundancy for s in scores]
[1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.3, 1.0]
>>> [s.regression for s in scores]
[1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
>>> [s.info_utilization for s in scores]
[1.0, 1.0, 0.7, 0.7, 1.0, 0.7, 0.7, 1.0]
>>> [s.score for s in scores]
[1.0, 0.5, 0.85, 0.35, 1.0, 0.85, 0.5, 1.0]

Deviations from the seed (section 11 lists the seed behaviour as a bug or weak spot):
- Re-running an identical non-read call after a write in between (e.g. `pytest` after an edit) is not
  redundant (seed: 0.3 regardless). Without a write in between it still scores 0.3.
- No signal means None, not a neutral value: a profile without any read/search/write/execute tool
  (e.g. `generic`) has no information-use signal (`info_utilization=None`), and one without write
  tools has no regression signal (`regression=None`); the seed reported constant 1.0.
- `efficiency` is None when no reference step count is known (seed: reference defaulted to the
  trajectory's own length, so efficiency was always 1.0).
- The outcome ratio `score/total` is clamped to [0, 1] (seed: not clamped).
- State keeps hashes of call keys and of (old, new) edit pairs instead of the raw strings, so it stays
  small; collisions of 64-bit blake2b digests are negligible.

Step score (`StepRuleScores.score`): the seed's rubric mapping, `non_redundancy = min(redundancy,
regression)` and `info_utilization`, averaged with the domain's rule-rubric weights over the rubrics
that are present; None when the domain has no rule rubric with a signal (advisory, discussion).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from streams.rubrics import INFO_UTILIZATION, NON_REDUNDANCY
from streams.rules.profiles import DomainProfile, OutcomeSpec, ToolCategory

REWARD_VERSION = "rules-1"
REDUNDANT_READ = 0.0
REDUNDANT_CALL = 0.3
UNINFORMED = 0.7
TARGET_PARAMS = ("file_path", "path", "url", "element_id")
_STRIP = ".,;:()[]{}\"'`"
READS = {ToolCategory.READ, ToolCategory.SEARCH}
ACTS = {ToolCategory.WRITE, ToolCategory.EXECUTE}


class StepInput(NamedTuple):
    """What the rules look at in one step."""

    tool: str
    params: Mapping[str, Any] = {}
    output: str = ""


@dataclass(frozen=True)
class StepRuleScores:
    redundancy: float | None
    regression: float | None
    info_utilization: float | None
    score: float | None


def step_input(step: Any) -> StepInput:
    """Normalise a flat `{tool, params, output}` dict, a shape-A step (`tool_call`/`tool_result`) or
    a StepRecorded-like object (`tool`, `params`, `observation`).

    >>> step_input({"tool_call": {"name": "bash", "parameters": {"command": "ls"}},
    ...             "tool_result": {"output": "a.py"}})
    StepInput(tool='bash', params={'command': 'ls'}, output='a.py')
    """
    if isinstance(step, StepInput):
        return step
    if isinstance(step, Mapping):
        if "tool_call" in step:
            call, result = step.get("tool_call") or {}, step.get("tool_result") or {}
            return StepInput(call.get("name", ""), call.get("parameters") or {}, result.get("output") or "")
        output = step.get("output", step.get("observation", ""))
        return StepInput(step.get("tool", ""), step.get("params") or {}, output or "")
    return StepInput(step.tool, step.params or {}, getattr(step, "observation", "") or "")


def target_param(spec_key: str, params: Mapping[str, Any]) -> str:
    """The object a call acts on: the tool's stateful key if present, else the first common key."""
    if spec_key and params.get(spec_key):
        return str(params[spec_key])
    for key in TARGET_PARAMS:
        if params.get(key):
            return str(params[key])
    return ""


def harvest_tokens(output: str) -> set[str]:
    """Information tokens in a tool output: paths (contain "/") and identifiers (contain "_").

    >>> sorted(harvest_tokens("see src/util.py, my_var and x_y (len<=3) and a/b"))
    ['my_var', 'src/util.py']
    """
    tokens = set()
    for word in output.split():
        if "/" not in word and "_" not in word:
            continue  # most words; stripping cannot add either character
        word = word.strip(_STRIP)
        if len(word) <= 3:
            continue
        if "/" in word or ("_" in word and word.isidentifier()):
            tokens.add(word.lower())
    return tokens


def _digest(*parts: str) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).hexdigest()


def _call_key(tool: str, params: Mapping[str, Any]) -> str:
    return _digest(tool, str(sorted(params.items())))


@dataclass
class RuleState:
    """Everything the per-step rules need to know about the earlier steps of one trajectory."""

    index: int = 0
    calls: dict[str, int] = field(default_factory=dict)  # call-key digest -> last index
    reads: dict[str, int] = field(default_factory=dict)  # target -> last read index
    writes: dict[str, int] = field(default_factory=dict)  # target -> last write index
    last_write: int = -1
    edits: dict[str, list[str]] = field(default_factory=dict)  # target -> (old, new) digests
    tokens: set[str] = field(default_factory=set)

    def score(self, step: StepInput, profile: DomainProfile) -> StepRuleScores:
        """Score the next step and fold it into the state."""
        spec = profile.tool(step.tool)
        category = spec.category if spec else None
        target = target_param(spec.stateful_key if spec else "", step.params)
        key = _call_key(step.tool, step.params)
        redundancy = self._redundancy(key, category, target)
        regression = (
            self._regression(category, target, step.params) if _has(profile, {ToolCategory.WRITE}) else None
        )
        info = self._info(category, step.params) if _has(profile, READS | ACTS) else None
        self._record(key, category, target, step.output)
        self._record_edit(category, target, step.params)
        return StepRuleScores(redundancy, regression, info, rule_score(redundancy, regression, info, profile))

    def _redundancy(self, key: str, category: ToolCategory | None, target: str) -> float:
        is_read = category in READS
        if is_read:
            edited = bool(target) and self.index > 0 and self._edited_since_read(target)
        else:
            edited = key in self.calls and self.last_write > self.calls[key]  # deviation, see docstring
        if key in self.calls and not edited:
            return REDUNDANT_READ if is_read else REDUNDANT_CALL
        if is_read and target and target in self.reads and not edited:
            return REDUNDANT_READ
        return 1.0

    def _edited_since_read(self, target: str) -> bool:
        if target not in self.writes:
            return False
        return target not in self.reads or self.writes[target] > self.reads[target]

    def _regression(self, category: ToolCategory | None, target: str, params: Mapping[str, Any]) -> float:
        old, new = params.get("old_string"), params.get("new_string")
        if category != ToolCategory.WRITE or not old or not new:
            return 1.0
        undo = _digest(str(new), str(old))
        return 0.0 if undo in self.edits.get(target, ()) else 1.0

    def _info(self, category: ToolCategory | None, params: Mapping[str, Any]) -> float:
        if self.index == 0 or category not in ACTS or not self.tokens:
            return 1.0
        text = str(params).lower()
        return 1.0 if any(token in text for token in self.tokens) else UNINFORMED

    def _record(self, key: str, category: ToolCategory | None, target: str, output: str) -> None:
        self.calls[key] = self.index
        if category in READS and target:
            self.reads[target] = self.index
        if category == ToolCategory.WRITE:
            self.last_write = self.index
            if target:
                self.writes[target] = self.index
        self.tokens |= harvest_tokens(output)
        self.index += 1

    def _record_edit(self, category: ToolCategory | None, target: str, params: Mapping[str, Any]) -> None:
        old, new = params.get("old_string"), params.get("new_string")
        if category == ToolCategory.WRITE and old and new:
            self.edits.setdefault(target, []).append(_digest(str(old), str(new)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "calls": self.calls,
            "reads": self.reads,
            "writes": self.writes,
            "last_write": self.last_write,
            "edits": self.edits,
            "tokens": sorted(self.tokens),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuleState:
        return cls(
            index=data["index"],
            calls=dict(data["calls"]),
            reads=dict(data["reads"]),
            writes=dict(data["writes"]),
            last_write=data["last_write"],
            edits={k: list(v) for k, v in data["edits"].items()},
            tokens=set(data["tokens"]),
        )


_HAS_CACHE: dict[tuple[int, frozenset], bool] = {}


def _has(profile: DomainProfile, categories: set[ToolCategory]) -> bool:
    key = (id(profile.tools), frozenset(categories))
    found = _HAS_CACHE.get(key)
    if found is None:
        found = _HAS_CACHE[key] = any(t.category in categories for t in profile.tools)
    return found


def rule_score(
    redundancy: float | None, regression: float | None, info: float | None, profile: DomainProfile
) -> float | None:
    """The weighted mean of the domain's rule rubrics that have a signal (None if none).

    >>> from streams.rules.profiles import CODING, CONVERSATION, ADVISORY
    >>> rule_score(0.3, 1.0, 0.7, CODING), rule_score(0.3, 1.0, 0.7, CONVERSATION)
    (0.5, 0.3)
    >>> rule_score(1.0, 1.0, 1.0, ADVISORY) is None
    True
    """
    present = [v for v in (redundancy, regression) if v is not None]
    rubric = {NON_REDUNDANCY: min(present) if present else None, INFO_UTILIZATION: info}
    total = weight = 0.0
    for rid, w in profile.rule_rubric_weights().items():
        value = rubric.get(rid)
        if value is not None and w > 0:
            total += w * value
            weight += w
    return round(total / weight, 6) if weight else None


def score_steps(steps: Iterable[Any], profile: DomainProfile) -> list[StepRuleScores]:
    """Score a whole trajectory's steps in order (the batch form of `RuleState.score`)."""
    state = RuleState()
    return [state.score(step_input(s), profile) for s in steps]


def efficiency(reference_steps: int | None, n_steps: int) -> float | None:
    """`clamp(reference / n, 0, 1)`; None without a reference (deviation: seed assumed 1.0).

    >>> efficiency(4, 8), efficiency(None, 8), efficiency(0, 8), efficiency(4, 0)
    (0.5, None, 1.0, 0.0)
    """
    if reference_steps is None:
        return None
    if reference_steps <= 0:
        return 1.0
    if n_steps <= 0:
        return 0.0
    return max(0.0, min(1.0, reference_steps / n_steps))


def outcome_score(outcome: Mapping[str, Any], spec: OutcomeSpec) -> float | None:
    """The seed's `check_outcome`, with the ratio clamped; None when there is no outcome.

    >>> from streams.rules.profiles import CODING
    >>> outcome_score({"success": True, "tests_passed": 3, "tests_total": 4}, CODING.outcome)
    0.75
    >>> outcome_score({"success": True}, OutcomeSpec()), outcome_score({}, OutcomeSpec())
    (1.0, None)
    """
    if not outcome:
        return None
    partial = outcome.get(spec.partial_credit_field) if spec.partial_credit_field else None
    if partial is not None:
        return max(0.0, min(1.0, float(partial)))
    if spec.score_field and spec.total_field:
        score, total = outcome.get(spec.score_field), outcome.get(spec.total_field)
        if score is not None and total:
            return max(0.0, min(1.0, float(score) / float(total)))
    return 1.0 if outcome.get(spec.success_field) else 0.0
