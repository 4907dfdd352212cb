"""Pure: the judge request for a batch of steps, a whole trajectory or a group, built from the
state records the processor keeps (`streams.judge.state` for a trajectory, `streams.judge.groups`
for a group). It only reads the records; what to judge and when is the processor's decision.
"""

from __future__ import annotations

from streams.judge.config import JudgeConfig
from streams.judge.prompt import group_prompt, step_prompt, trajectory_prompt
from streams.judge.requests import JudgeRequest, Target
from streams.judge.rubrics import RubricSet
from streams.judge.selection import JudgeRule
from streams.judge.state import step_view, trajectory_view


def step_request(
    tid: str, rec: dict, rule: JudgeRule, indices: list[int], rubrics: RubricSet, config: JudgeConfig
) -> JudgeRequest:
    """The steps `indices` of trajectory `tid`, with up to `rule.context_steps` earlier steps as context."""
    by_index = {s["i"]: s for s in rec["steps"]}
    steps = [by_index[i] for i in indices]
    first = min(indices)
    context = [s for s in sorted(rec["steps"], key=lambda s: s["i"]) if s["i"] < first][-rule.context_steps :]
    prompt = step_prompt(
        rec.get("task", ""),
        rubrics,
        [step_view(s) for s in steps],
        [step_view(s) for s in context] if rule.context_steps else [],
        config.observation_chars,
    )
    targets = [Target(tid, s["eid"], step_index=s["i"]) for s in steps]
    return JudgeRequest("step", prompt, rubrics, targets, model=config.model)


def trajectory_request(tid: str, rec: dict, rubrics: RubricSet, config: JudgeConfig) -> JudgeRequest:
    """Trajectory `tid` whole, once it has ended."""
    view = trajectory_view("T1", rec["steps"], rec.get("ended"))
    prompt = trajectory_prompt(rec.get("task", ""), rubrics, view, config.observation_chars * 4)
    target = Target(tid, rec["ended"]["event_id"], label="T1", group_id=rec.get("group_id"))
    return JudgeRequest("trajectory", prompt, rubrics, [target], model=config.model)


def group_request(group_id: str, group: dict, rubrics: RubricSet, config: JudgeConfig) -> JudgeRequest:
    """Every member of a group compared in one call, labelled T1, T2, ... in trajectory id order."""
    members = [group["members"][k] for k in sorted(group["members"])]
    labels = [f"T{i + 1}" for i in range(len(members))]
    views = [trajectory_view(lbl, m["steps"], m.get("ended")) for lbl, m in zip(labels, members, strict=True)]
    prompt = group_prompt(group.get("task", ""), rubrics, views, config.observation_chars * 2)
    targets = [
        Target(m["trajectory_id"], m["ended"]["event_id"], label=lbl, group_id=group_id)
        for lbl, m in zip(labels, members, strict=True)
    ]
    return JudgeRequest("group", prompt, rubrics, targets, model=config.model)
