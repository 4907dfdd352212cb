"""`up --judge` runs the judge and tells scoring to wait for it (`--expect-judge`)."""

from __future__ import annotations

from infra.stack import components, embedded_config


def test_the_stack_tells_scoring_when_the_judge_runs(tmp_path):
    def args_of(name, **kwargs):
        return next(c.args for c in components(embedded_config(tmp_path, **kwargs)) if c.name == name)

    assert "--expect-judge" in args_of("scoring", judge=True)  # rule rewards + assembly in one role
    assert "--expect-judge" not in args_of("scoring")
    assert "--expect-judge" in args_of("scoring-1", judge=True, workers=2)  # every slot is told
    assert args_of("judge", judge=True) == ("worker", "--roles", "judge")
