"""Reward versions: how a trajectory's `reward_version` ('assembly-1+rules-2') relates to the rules
version a replay or the live stack is run under ('rules-2'). Pure; docs/reward-versions.md.
"""

from __future__ import annotations

LIVE_RULES_VERSION = "rules-1"  # the rules version the live stack stamps unless configured otherwise


def rules_version_of(reward_version: str) -> str:
    """The rules part of a trajectory's reward version (what `--reward-version` of a replay names):
    everything after the assembly version.

    >>> rules_version_of("assembly-1+rules-2"), rules_version_of("rules-2"), rules_version_of("")
    ('rules-2', 'rules-2', '')
    """
    return reward_version.split("+", 1)[1] if "+" in reward_version else reward_version


def reward_version_matches(stamped: str, selected: str) -> bool:
    """Whether a trajectory stamped `stamped` is of the `selected` version: the same string, or
    `selected` names its rules version (`rules-2` selects `assembly-1+rules-2`).

    >>> reward_version_matches("assembly-1+rules-2", "rules-2")
    True
    >>> reward_version_matches("assembly-1+rules-1", "rules-2"), reward_version_matches("", "rules-1")
    (False, False)
    """
    return bool(stamped) and (stamped == selected or rules_version_of(stamped) == selected)
