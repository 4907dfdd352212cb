"""Simulated agents for the demo and the end-to-end benchmark: small tool environments and policies of
different quality. Pure and deterministic: the same (task, policy, rollout) always plays the same way.

A policy's `skill` sets how often it makes progress, repeats a read, undoes an edit or ignores what it
just read, so the rule rewards, success rates and the leaderboard separate the policies the way a user
would expect (strong > medium > weak), while group rollouts of one task still differ (GRPO needs that).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Policy:
    model: str
    skill: float  # 0..1: probability of a useful next action
    agent: str = "sim-agent"


POLICIES = (
    Policy("sim-strong", 0.9),
    Policy("sim-medium", 0.7),
    Policy("sim-weak", 0.45),
)


@dataclass(frozen=True)
class Task:
    task_id: str
    domain: str
    instruction: str
    target: str  # the file / url / topic the task is about
    reference_steps: int


@dataclass
class PlannedStep:
    thought: str
    tool: str
    params: dict
    observation: str
    exit_code: int | None = None
    error: str | None = None


@dataclass
class Rollout:
    task: Task
    policy: Policy
    group_id: str
    steps: list[PlannedStep] = field(default_factory=list)
    success: bool = False
    score: float = 0.0
    tests_passed: int | None = None
    tests_failed: int | None = None


def tasks(count: int) -> list[Task]:
    """`count` tasks, cycling through the three environments."""
    makers = (_coding_task, _browser_task, _support_task)
    return [makers[i % len(makers)](i) for i in range(count)]


def _coding_task(i: int) -> Task:
    module = f"src/pkg/module_{i}.py"
    return Task(f"fix-bug-{i}", "coding", f"Fix the failing test for {module}", module, 4)


def _browser_task(i: int) -> Task:
    url = f"https://shop.example/item/{i}"
    return Task(f"find-price-{i}", "browser", f"Find the price of item {i} on {url}", url, 3)


def _support_task(i: int) -> Task:
    return Task(
        f"answer-ticket-{i}", "conversation", f"Answer support ticket #{i} about refunds", f"ticket {i}", 2
    )


def play(task: Task, policy: Policy, rollout: int, group_id: str, max_steps: int | None = None) -> Rollout:
    """Play one rollout of `policy` on `task` (deterministic in its arguments). The step budget is the
    task's reference step count plus one: a policy that wastes more than one step fails."""
    max_steps = max_steps or task.reference_steps + 1
    rng = random.Random(f"{task.task_id}|{policy.model}|{rollout}")
    env = {"coding": _CodingEnv, "browser": _BrowserEnv, "conversation": _SupportEnv}[task.domain](task, rng)
    result = Rollout(task, policy, group_id)
    while len(result.steps) < max_steps and not env.done:
        useful = rng.random() < policy.skill
        result.steps.append(env.progress() if useful else env.mistake())
    result.success = env.done
    result.score = 1.0 if env.done else round(env.progress_made / env.needed, 3)
    if task.domain == "coding":
        result.tests_passed = 4 if env.done else env.progress_made
        result.tests_failed = 4 - result.tests_passed
    return result


class _Env:
    needed = 3

    def __init__(self, task: Task, rng: random.Random):
        self.task, self.rng = task, rng
        self.progress_made = 0

    @property
    def done(self) -> bool:
        return self.progress_made >= self.needed

    def progress(self) -> PlannedStep:
        step = self._useful(self.progress_made)
        self.progress_made += 1
        return step

    def _useful(self, stage: int) -> PlannedStep:
        raise NotImplementedError

    def mistake(self) -> PlannedStep:
        raise NotImplementedError


class _CodingEnv(_Env):
    needed = 4

    def _useful(self, stage: int) -> PlannedStep:
        path = self.task.target
        name = path.rsplit("/", 1)[-1].removesuffix(".py")
        if stage == 0:
            return PlannedStep(
                "Run the tests to see what fails.",
                "bash",
                {"command": "pytest -x"},
                f"FAILED tests/test_{name}.py::test_parse - KeyError in {path} parse_config",
                1,
            )
        if stage == 1:
            return PlannedStep(
                "Read the module named in the traceback.",
                "read_file",
                {"file_path": path},
                f"def parse_config(raw):\n    return raw['timeout']  # {path} parse_config",
                0,
            )
        if stage == 2:
            return PlannedStep(
                "Use a default when the key is missing.",
                "edit_file",
                {"file_path": path, "old_string": "raw['timeout']", "new_string": "raw.get('timeout', 30)"},
                f"edited {path}",
                0,
            )
        return PlannedStep(
            "Re-run the tests.", "bash", {"command": f"pytest -x tests/test_{name}.py"}, "4 passed", 0
        )

    def mistake(self) -> PlannedStep:
        path = self.task.target
        kind = self.rng.choice(("reread", "undo", "blind", "noise"))
        if kind == "reread":
            return PlannedStep(
                "Look at the file again.", "read_file", {"file_path": path}, "def parse_config(raw): ...", 0
            )
        if kind == "undo":
            self.progress_made = min(self.progress_made, 2)  # the fix is gone again
            return PlannedStep(
                "Revert my change.",
                "edit_file",
                {"file_path": path, "old_string": "raw.get('timeout', 30)", "new_string": "raw['timeout']"},
                f"edited {path}",
                0,
            )
        if kind == "blind":
            return PlannedStep(
                "Try something else.",
                "bash",
                {"command": "python -c 'print(1)'"},
                "1",
                0,
            )
        return PlannedStep(
            "List files.", "bash", {"command": "ls /nonexistent"}, "ls: cannot access", 2, "exit status 2"
        )


class _BrowserEnv(_Env):
    needed = 3

    def _useful(self, stage: int) -> PlannedStep:
        url = self.task.target
        if stage == 0:
            return PlannedStep(
                "Open the product page.", "navigate", {"url": url}, f"loaded {url} #price-box", 0
            )
        if stage == 1:
            return PlannedStep(
                "Read the price box.", "extract_text", {"element_id": "price-box"}, "Price: $42.00", 0
            )
        return PlannedStep("Report the price.", "submit", {"answer": "$42.00"}, "accepted", 0)

    def mistake(self) -> PlannedStep:
        kind = self.rng.choice(("reread", "wrong_click", "scroll"))
        if kind == "reread":
            return PlannedStep(
                "Read it again.", "extract_text", {"element_id": "price-box"}, "Price: $42.00", 0
            )
        if kind == "wrong_click":
            return PlannedStep(
                "Click the banner.", "click", {"element_id": "ad-banner"}, "opened an advert", 0
            )
        return PlannedStep("Scroll down.", "scroll", {"direction": "down"}, "footer", 0)


class _SupportEnv(_Env):
    needed = 2

    def _useful(self, stage: int) -> PlannedStep:
        if stage == 0:
            return PlannedStep(
                "Look up the refund policy.",
                "query_stats",
                {"query": "refund policy"},
                "refund_window_days=30 requires receipt_number",
                0,
            )
        return PlannedStep(
            "Answer with the policy.",
            "respond",
            {"text": "Refunds are possible within 30 days (refund_window_days) with your receipt_number."},
            "sent",
            0,
        )

    def mistake(self) -> PlannedStep:
        kind = self.rng.choice(("vague", "repeat"))
        if kind == "vague":
            return PlannedStep("Reply quickly.", "respond", {"text": "Please wait."}, "sent", 0)
        return PlannedStep(
            "Look it up again.",
            "query_stats",
            {"query": "refund policy"},
            "refund_window_days=30 requires receipt_number",
            0,
        )
