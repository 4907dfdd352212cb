"""Domain profiles: which tools a domain has, what they do, how its outcome and rubrics are weighted.

Owns the seven built-in profiles of the seed (coding, browser, conversation, engineering, advisory,
discussion, generic; reference/seed-knowlyr-gym.md sections 2.4 and 2.5) and loading user profiles
from a JSON or YAML file. Pure data: no I/O except `load_profiles(path)`. No profiles file given
means the built-ins; a profiles file given that does not exist is a `ProfileError` naming it.

A profile carries:
- `tools`: ToolSpec(name, category, stateful_key, aliases); lookups are by name or alias.
- `outcome`: OutcomeSpec (success / score / total / partial-credit field names of the outcome).
- `rubrics`: rubric id -> RubricSpec(weight, evaluator "rule" | "model" | "human"); the built-in
  profiles take theirs from `streams.rubrics.BUILTIN_RUBRICS`, as the judge's rubric sets do.
- `reward_weights`: outcome / process / efficiency (default 0.4 / 0.5 / 0.1).
- `layer_weights` (optional): rule / judge / human weights of a step's process score. When absent,
  rule = sum of the rule-rubric weights, judge = sum of the model-rubric weights, human = 1.0, which
  makes rule + judge equal to the seed's weighted rubric mean.

Deviations from the seed (each deliberate):
- The seed's 8th, undocumented `crew` profile is not built in (its outcome spec is a bug: steps/tokens).
  Users can load an equivalent profile from a file. `crew` resolves to `generic`, whose rubrics are
  the seed's crew rubrics; the judge does the same (one catalogue: streams.rubrics).
- `default_rubric_weights` was never read in the seed; here `rubrics` and `reward_weights` are used.
- Unknown domain names resolve to `generic` (as in the seed) but the caller can see it via `.domain`.

User profile file (JSON or YAML): either one profile mapping or `{"profiles": [ ... ]}`. Example:

    domain: sandbox
    extends: coding            # optional: start from a built-in and override
    tools:
      - {name: file_read, category: read, stateful_key: path}
      - {name: shell, category: execute, aliases: [sh]}
    outcome: {success_field: success}
    rubrics: {info_utilization: {weight: 0.5, evaluator: rule}, non_redundancy: {weight: 0.5}}
    reward_weights: {outcome: 0.5, process: 0.4, efficiency: 0.1}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from streams.errors import ProfileError, option_file
from streams.rubrics import BUILTIN_RUBRICS, EVALUATORS, default_evaluator


class ToolCategory(StrEnum):
    READ = "read"
    WRITE = "write"
    SEARCH = "search"
    EXECUTE = "execute"
    NAVIGATE = "navigate"
    SUBMIT = "submit"
    THINK = "think"


@dataclass(frozen=True)
class ToolSpec:
    name: str
    category: ToolCategory
    stateful_key: str = ""
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class OutcomeSpec:
    success_field: str = "success"
    score_field: str = ""
    total_field: str = ""
    partial_credit_field: str = "partial_credit"


@dataclass(frozen=True)
class RubricSpec:
    weight: float
    evaluator: str = "model"  # rule | model | human


@dataclass(frozen=True)
class RewardWeights:
    outcome: float = 0.4
    process: float = 0.5
    efficiency: float = 0.1


@dataclass(frozen=True)
class DomainProfile:
    domain: str
    tools: tuple[ToolSpec, ...] = ()
    outcome: OutcomeSpec = OutcomeSpec()
    rubrics: Mapping[str, RubricSpec] = field(default_factory=dict)
    reward_weights: RewardWeights = RewardWeights()
    layer_weights: Mapping[str, float] | None = None
    display_name: str = ""

    def tool(self, name: str) -> ToolSpec | None:
        """The ToolSpec for a tool name or alias (exact match, as in the seed)."""
        return _tool_index(self).get(name)

    def rule_rubric_weights(self) -> dict[str, float]:
        return {rid: r.weight for rid, r in self.rubrics.items() if r.evaluator == "rule"}

    def model_rubric_weights(self) -> dict[str, float]:
        return {rid: r.weight for rid, r in self.rubrics.items() if r.evaluator == "model"}

    def layers(self) -> dict[str, float]:
        """Weights of the rule / judge / human layers in a step's process score."""
        if self.layer_weights is not None:
            return dict(self.layer_weights)
        return {
            "rule": sum(self.rule_rubric_weights().values()),
            "judge": sum(self.model_rubric_weights().values()),
            "human": 1.0,
        }


_INDEX_CACHE: dict[int, dict[str, ToolSpec]] = {}


def _tool_index(profile: DomainProfile) -> dict[str, ToolSpec]:
    key = id(profile.tools)
    index = _INDEX_CACHE.get(key)
    if index is None:
        index = {}
        for spec in profile.tools:
            index[spec.name] = spec
            for alias in spec.aliases:
                index.setdefault(alias, spec)
        _INDEX_CACHE[key] = index
    return index


# --- built-in profiles (seed section 2.5) ---------------------------------------------------------

R, W, S, X, N, SUB, T = (
    ToolCategory.READ,
    ToolCategory.WRITE,
    ToolCategory.SEARCH,
    ToolCategory.EXECUTE,
    ToolCategory.NAVIGATE,
    ToolCategory.SUBMIT,
    ToolCategory.THINK,
)


def _t(name: str, category: ToolCategory, key: str = "", *aliases: str) -> ToolSpec:
    return ToolSpec(name, category, key, tuple(aliases))


def _builtin(
    domain: str, tools: tuple[ToolSpec, ...] = (), outcome: OutcomeSpec = OutcomeSpec()
) -> DomainProfile:
    """A built-in profile: its rubrics from the one catalogue the judge reads too (streams.rubrics)."""
    rubrics = {r.id: RubricSpec(r.weight, r.evaluator) for r in BUILTIN_RUBRICS[domain]}
    return DomainProfile(domain, tools, outcome, rubrics, display_name=domain.title())


THINK = _t("think", T)
RESPOND = _t("respond", W, "", "reply", "answer")
WEB_SEARCH = _t("web_search", S, "", "search", "browse")
CREATE_NOTE = _t("create_note", W, "", "note", "memo")

CODING = _builtin(
    "coding",
    (
        _t("read_file", R, "file_path", "Read", "cat"),
        _t("edit_file", W, "file_path", "Edit", "sed", "write_file", "Write"),
        _t("bash", X, "", "Bash", "shell", "run"),
        _t("grep", S, "", "Grep", "Glob", "find", "ls", "search"),
        _t("git", X),
        _t("ipython", X),
        _t("submit", SUB),
        _t("finish", SUB),
        THINK,
    ),
    OutcomeSpec(score_field="tests_passed", total_field="tests_total"),
)
BROWSER = _builtin(
    "browser",
    (
        _t("click", W, "element_id", "tap"),
        _t("type_text", W, "element_id", "type", "fill", "input"),
        _t("navigate", N, "url", "goto", "open_url"),
        _t("screenshot", R),
        _t("scroll", N, "", "scroll_up", "scroll_down"),
        _t("wait", R),
        _t("extract_text", R),
        _t("select", W),
        _t("submit", SUB),
    ),
)
CONVERSATION = _builtin(
    "conversation",
    (
        RESPOND,
        _t("query_stats", R, "", "query", "lookup", "get_stats"),
        _t("send_message", W, "", "message", "notify"),
        _t("delegate", X, "", "assign", "dispatch"),
        WEB_SEARCH,
        CREATE_NOTE,
        THINK,
    ),
)
ENGINEERING = _builtin(
    "engineering",
    (
        _t("read_file", R, "file_path", "file_read", "cat"),
        _t("grep", S, "", "glob", "find", "search"),
        _t("git", X, "", "git_diff", "git_log"),
        _t("knowledge_base", R, "", "kb", "docs"),
        _t("bash", X, "", "shell", "run"),
        THINK,
    ),
)
ADVISORY = _builtin(
    "advisory",
    (RESPOND, _t("knowledge_base", R, "", "kb", "docs", "research"), WEB_SEARCH, CREATE_NOTE, THINK),
)
DISCUSSION = _builtin(
    "discussion",
    (_t("respond", W, "", "reply", "contribute"), _t("knowledge_base", R, "", "kb", "reference"), THINK),
)
GENERIC = _builtin("generic")

BUILTIN_PROFILES: dict[str, DomainProfile] = {
    p.domain: p for p in (CODING, BROWSER, CONVERSATION, ENGINEERING, ADVISORY, DISCUSSION, GENERIC)
}


class ProfileRegistry:
    """Built-in profiles plus user profiles (which override built-ins of the same name)."""

    def __init__(self, extra: Mapping[str, DomainProfile] | None = None):
        self._profiles = {**BUILTIN_PROFILES, **(extra or {})}

    def get(self, domain: str | None) -> DomainProfile:
        """The profile for `domain`; unknown domains get `generic` (as in the seed)."""
        return self._profiles.get(domain or "generic") or self._profiles["generic"]

    def names(self) -> list[str]:
        return sorted(self._profiles)

    @classmethod
    def from_file(cls, path: str | Path | None) -> ProfileRegistry:
        """Built-ins plus the profiles in `path`; no path given (None or empty) gives the built-ins,
        a path given that does not exist raises ProfileError naming it."""
        found = option_file(path, "profiles file", ProfileError)
        return cls(load_profiles(found) if found else None)


# --- loading user profiles ------------------------------------------------------------------------


def load_profiles(path: str | Path) -> dict[str, DomainProfile]:
    """Read one profile or `{"profiles": [...]}` from a JSON or YAML file."""
    path = Path(path)
    if not path.exists():
        raise ProfileError(f"profiles file {path} does not exist")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(f"profiles file {str(path)!r}: cannot read: {exc}") from None
    data = _parse(text, path)
    items = data.get("profiles") if isinstance(data, dict) and "profiles" in data else [data]
    if not isinstance(items, list):
        raise ProfileError(f"profiles file {str(path)!r}: 'profiles' must be a list, got {items!r}")
    profiles = {}
    for i, item in enumerate(items):
        profile = profile_from_mapping(item, where=f"{path}[{i}]")
        profiles[profile.domain] = profile
    return profiles


def _parse(text: str, path: Path) -> Any:
    if path.suffix.lower() in {".yaml", ".yml"}:
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ProfileError(f"profiles file {str(path)!r}: invalid YAML: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profiles file {str(path)!r}: invalid JSON: {exc}") from None


def profile_from_mapping(data: Any, where: str = "profile") -> DomainProfile:
    """Build a DomainProfile from a plain mapping (see the module docstring for the shape)."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: a profile must be a mapping, got {data!r}")
    domain = data.get("domain")
    if not isinstance(domain, str) or not domain:
        raise ProfileError(f"{where}.domain: must be a non-empty string, got {domain!r}")
    base = _base(data.get("extends"), where)
    changes: dict[str, Any] = {"domain": domain, "display_name": str(data.get("display_name", domain))}
    if "tools" in data:
        changes["tools"] = tuple(_tool(t, f"{where}.tools[{i}]") for i, t in enumerate(data["tools"] or []))
    if "outcome" in data or "outcome_spec" in data:
        changes["outcome"] = _outcome(data.get("outcome", data.get("outcome_spec")), f"{where}.outcome")
    if "rubrics" in data:
        changes["rubrics"] = _rubric_map(data["rubrics"], f"{where}.rubrics")
    if "reward_weights" in data:
        changes["reward_weights"] = _reward_weights(data["reward_weights"], f"{where}.reward_weights")
    if "layer_weights" in data:
        changes["layer_weights"] = _weights(data["layer_weights"], f"{where}.layer_weights")
    return replace(base, **changes)


def _base(name: Any, where: str) -> DomainProfile:
    if name is None:
        return GENERIC
    if name not in BUILTIN_PROFILES:
        raise ProfileError(
            f"{where}.extends: unknown profile {name!r} (built-in: {sorted(BUILTIN_PROFILES)})"
        )
    return BUILTIN_PROFILES[name]


def _tool(data: Any, where: str) -> ToolSpec:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        raise ProfileError(f"{where}: a tool needs a non-empty 'name', got {data!r}")
    try:
        category = ToolCategory(str(data.get("category", "")).lower())
    except ValueError:
        allowed = [c.value for c in ToolCategory]
        raise ProfileError(f"{where}.category: {data.get('category')!r} is not one of {allowed}") from None
    aliases = data.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ProfileError(f"{where}.aliases: must be a list of strings, got {aliases!r}")
    return ToolSpec(data["name"], category, str(data.get("stateful_key") or ""), tuple(aliases))


def _outcome(data: Any, where: str) -> OutcomeSpec:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: must be a mapping, got {data!r}")
    known = set(OutcomeSpec.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {unknown} (known: {sorted(known)})")
    return OutcomeSpec(**{k: str(v or "") for k, v in data.items()})


def _rubric_map(data: Any, where: str) -> dict[str, RubricSpec]:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: must be a mapping of rubric id -> weight or spec, got {data!r}")
    out = {}
    for rid, spec in data.items():
        if isinstance(spec, int | float):
            spec = {"weight": spec}
        if not isinstance(spec, dict):
            raise ProfileError(f"{where}.{rid}: must be a weight or {{weight, evaluator}}, got {spec!r}")
        weight = _number(spec.get("weight"), f"{where}.{rid}.weight")
        evaluator = spec.get("evaluator", default_evaluator(str(rid)))
        if evaluator not in EVALUATORS:
            raise ProfileError(f"{where}.{rid}.evaluator: {evaluator!r} is not rule, model or human")
        out[str(rid)] = RubricSpec(weight, evaluator)
    return out


def _reward_weights(data: Any, where: str) -> RewardWeights:
    weights = _weights(data, where)
    unknown = sorted(set(weights) - {"outcome", "process", "efficiency"})
    if unknown:
        raise ProfileError(f"{where}: unknown component(s) {unknown} (known: outcome, process, efficiency)")
    return RewardWeights(**{**RewardWeights().__dict__, **weights})


def _weights(data: Any, where: str) -> dict[str, float]:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: must be a mapping of name -> weight, got {data!r}")
    return {str(k): _number(v, f"{where}.{k}") for k, v in data.items()}


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ProfileError(f"{where}: must be a non-negative number, got {value!r}")
    return float(value)
