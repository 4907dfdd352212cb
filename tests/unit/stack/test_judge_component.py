"""`up --judge` runs the judge and tells the assemblers to wait for it (`--expect-judge`)."""

from __future__ import annotations

from infra.stack import components, embedded_config


def test_the_stack_tells_its_assemblers_when_the_judge_runs(tmp_path):
    def args_of(name, **kwargs):
        return next(c.args for c in components(embedded_config(tmp_path, **kwargs)) if c.name == name)

    assert "--expect-judge" in args_of("scoring", judge=True)  # the default: rules + assembly in one role
    assert "--expect-judge" not in args_of("scoring")
    split = {"roles": ("rules", "assembler")}
    assert "--expect-judge" in args_of("assembler", judge=True, **split)
    assert "--expect-judge" not in args_of("assembler", **split)
