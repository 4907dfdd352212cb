"""`ConversationEnv`: a dialogue task with domain tools, registered as "conversation",
"engineering", "advisory" and "discussion" (one id per domain, each with its tools):

| domain       | tools (besides respond, think)                 | terminal tools   |
|--------------|------------------------------------------------|------------------|
| conversation | query_stats, send_message, web_search          | respond          |
| engineering  | read_file, grep, bash, git, submit             | submit, finish   |
| advisory     | knowledge_base, web_search, submit             | submit, finish   |
| discussion   | knowledge_base                                 | respond, submit  |

A tool is a callable `fn(params) -> {"output": str, "exit_code": int}`; the defaults are mock tools
that echo their params (the env is a harness for recording dialogue, not a world model). A task is
a str, or a dict with `user_message` / `context` / `description` and an optional `expected`: a
string the final response must contain (case-insensitive), which is what `verify()` checks.

    env = ConversationEnv("advisory", tools={"knowledge_base": my_kb})
    env.reset(task={"user_message": "Should we shard the topic?", "expected": "partition"})
    env.step({"tool": "submit", "params": {"response": "Add partitions first ..."}})
    env.verify()   # True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from producers.envs.errors import EnvError
from producers.envs.protocol import Action, AgentEnv, TimeStep, checked_action, finish_step

Tool = Callable[[dict[str, Any]], dict[str, Any]]

COMMON_TOOLS = ("respond", "think")
DOMAIN_TOOLS: dict[str, tuple[str, ...]] = {
    "conversation": ("query_stats", "send_message", "web_search"),
    "engineering": ("read_file", "grep", "bash", "git", "submit"),
    "advisory": ("knowledge_base", "web_search", "submit"),
    "discussion": ("knowledge_base",),
}
TERMINAL_TOOLS: dict[str, frozenset[str]] = {
    "conversation": frozenset({"respond"}),
    "engineering": frozenset({"submit", "finish"}),
    "advisory": frozenset({"submit", "finish"}),
    "discussion": frozenset({"respond", "submit"}),
}
DEFAULT_TERMINAL = frozenset({"submit", "finish"})
RESPONSE_KEYS = ("response", "content", "message", "answer", "text")


def echo_tool(name: str) -> Tool:
    """A mock tool that answers its own name and params.

    >>> echo_tool("web_search")({"query": "kafka"})
    {'output': "[web_search] {'query': 'kafka'}", 'exit_code': 0}
    """

    def tool(params: dict[str, Any]) -> dict[str, Any]:
        return {"output": f"[{name}] {params}", "exit_code": 0}

    return tool


def response_text(params: dict[str, Any]) -> str:
    """The text of a respond/submit call: the first of `response`, `content`, `message`, `answer`,
    `text` that is a string, else the params as text.

    >>> response_text({"content": "hi"}), response_text({"n": 1})
    ('hi', "{'n': 1}")
    """
    for key in RESPONSE_KEYS:
        if isinstance(params.get(key), str):
            return params[key]
    return str(params)


class ConversationEnv(AgentEnv):
    """A dialogue task with mock or injected tools (see the module docstring)."""

    def __init__(
        self, domain: str = "conversation", tools: dict[str, Tool] | None = None, max_turns: int = 20
    ):
        if not isinstance(domain, str) or not domain:
            raise EnvError(f"domain: expected a non-empty string, got {domain!r}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise EnvError(f"max_turns: expected a positive integer, got {max_turns!r}")
        if tools is not None and not (isinstance(tools, dict) and all(callable(f) for f in tools.values())):
            raise EnvError(f"tools: expected a dict of name -> callable(params), got {tools!r}")
        self.domain = domain
        self.terminal_tools = TERMINAL_TOOLS.get(domain, DEFAULT_TERMINAL)
        names = (*COMMON_TOOLS, *DOMAIN_TOOLS.get(domain, ()), *sorted(self.terminal_tools))
        self.tools: dict[str, Tool] = {name: echo_tool(name) for name in dict.fromkeys(names)}
        self.tools |= tools or {}
        self.max_turns = max_turns
        self.task: Any = None
        self.turn = 0
        self.final_response: str | None = None
        self._started = False
        self._done = False

    @property
    def available_tools(self) -> list[str]:
        return list(self.tools)

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        """Start a dialogue on `task` (a str or a dict; None: an empty opening)."""
        self.task, self.turn, self.final_response = task, 0, None
        self._started, self._done = True, False
        info = {"domain": self.domain, "max_turns": self.max_turns, "available_tools": self.available_tools}
        if isinstance(task, dict) and task.get("task_id") is not None:
            info["task_id"] = task["task_id"]
        return TimeStep(observation=task_text(task), info=info)

    def step(self, action: Action) -> TimeStep:
        """Call one tool; a terminal tool ends the episode, an unknown tool answers an error."""
        tool, params = checked_action(action, self._started, self._done)
        self.turn += 1
        if not isinstance(params, dict):
            ts = _failed(tool, f"params: expected an object, got {params!r}")
        elif tool not in self.tools:
            ts = _failed(tool, f"unknown tool {tool!r}; available tools: {self.available_tools}")
        else:
            ts = self._call(tool, params)
        if tool in self.terminal_tools and tool in self.tools:
            ts.terminated = True
            self.final_response = response_text(params) if isinstance(params, dict) else str(params)
        finish_step(ts, self.turn, self.max_turns)
        self._done = ts.done
        return ts

    def _call(self, tool: str, params: dict[str, Any]) -> TimeStep:
        try:
            answer = self.tools[tool](params)
        except Exception as exc:  # an injected tool's failure is the agent's observation, not a crash
            return _failed(tool, f"{tool}: {type(exc).__name__}: {exc}")
        if not isinstance(answer, dict):
            return _failed(
                tool, f"{tool}: returned {type(answer).__name__}, expected {{'output', 'exit_code'}}"
            )
        output, code = str(answer.get("output", "")), answer.get("exit_code", 0)
        code = code if isinstance(code, int) else 1
        info = {"exit_code": code, "error": None if code == 0 else output, "tool": tool}
        return TimeStep(observation=output, info=info)

    def verify(self) -> bool | None:
        """With a task `expected` string: whether the final response contains it (case-insensitive;
        False when the episode ended without one). None when the task has no `expected`."""
        expected = self.task.get("expected") if isinstance(self.task, dict) else None
        if not isinstance(expected, str) or not expected:
            return None
        return self.final_response is not None and expected.casefold() in self.final_response.casefold()


def task_text(task: Any) -> str:
    """The opening observation: the task itself when a str, else its `user_message`, `context`
    or `description` (the first present).

    >>> task_text("hi"), task_text({"context": "c", "description": "d"}), task_text(None)
    ('hi', 'c', '')
    """
    if task is None:
        return ""
    if isinstance(task, str):
        return task
    if isinstance(task, dict):
        for key in ("user_message", "context", "description"):
            if isinstance(task.get(key), str) and task[key]:
                return task[key]
        raise EnvError(
            f"conversation task: needs 'user_message', 'context' or 'description', got keys {sorted(task)}"
        )
    raise EnvError(f"conversation task: expected a str or an object, got {type(task).__name__}")


def _failed(tool: Any, error: str) -> TimeStep:
    return TimeStep(observation=f"error: {error}", info={"exit_code": 1, "error": error, "tool": tool})
