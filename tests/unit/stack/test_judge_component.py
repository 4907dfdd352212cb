"""`up --judge` runs the judge and tells the assemblers to wait for it (`--expect-judge`)."""

from __future__ import annotations

from infra.stack import components, embedded_config


def test_the_stack_tells_its_assemblers_when_the_judge_runs(tmp_path):
    def assembler_args(**kwargs):
        return next(c.args for c in components(embedded_config(tmp_path, **kwargs)) if c.name == "assembler")

    assert "--expect-judge" in assembler_args(judge=True)
    assert "--expect-judge" not in assembler_args()
