"""ConversationEnv: per-domain tools and terminal tools, injected tools, unknown tools, max_turns
and verify() against the task's expected text."""

from __future__ import annotations

import pytest

from producers.envs import ConversationEnv, EnvError, builtin_tasks, list_envs, make


def act(env, tool, **params):
    return env.step({"tool": tool, "params": params})


@pytest.mark.parametrize(
    ("env_id", "tools", "terminal"),
    [
        ("conversation", {"respond", "think", "query_stats", "send_message", "web_search"}, {"respond"}),
        (
            "engineering",
            {"respond", "think", "read_file", "grep", "bash", "git", "submit", "finish"},
            {"submit", "finish"},
        ),
        (
            "advisory",
            {"respond", "think", "knowledge_base", "web_search", "submit", "finish"},
            {"submit", "finish"},
        ),
        ("discussion", {"respond", "think", "knowledge_base", "submit"}, {"respond", "submit"}),
    ],
)
def test_registered_domains_have_their_tools(env_id, tools, terminal):
    env = make(env_id)
    assert env.domain == env_id and env_id in list_envs(domain=env_id)
    assert set(env.available_tools) == tools and env.terminal_tools == terminal
    ts = env.reset(task="hello")
    assert ts.observation == "hello" and ts.info["available_tools"] == env.available_tools


def test_mock_tools_echo_and_do_not_terminate():
    env = ConversationEnv("conversation")
    env.reset(task={"user_message": "How many orders today?", "context": "shop"})
    ts = act(env, "query_stats", metric="orders")
    assert ts.observation == "[query_stats] {'metric': 'orders'}" and ts.info["exit_code"] == 0
    assert not ts.done


def test_terminal_tool_ends_the_episode_and_verify_checks_expected():
    env = ConversationEnv("advisory")
    env.reset(task={"user_message": "Which index?", "expected": "Customer_ID"})
    assert not act(env, "respond", response="thinking about customer_id").done  # not terminal here
    ts = act(env, "submit", response="Add a composite index on (customer_id, created_at).")
    assert ts.terminated and not ts.truncated
    assert env.verify() is True
    with pytest.raises(EnvError, match="after the episode ended"):
        act(env, "respond", response="again")


def test_claim_without_the_expected_content_fails():
    env = ConversationEnv("discussion")
    env.reset(task={"description": "retry or dead-letter?", "expected": "dead-letter"})
    act(env, "respond", response="I am confident my answer is correct: retry forever.")
    assert env.verify() is False


def test_verify_is_none_without_expected_and_false_before_a_response():
    env = ConversationEnv()
    env.reset(task="hi")
    assert env.verify() is None
    env.reset(task={"user_message": "hi", "expected": "hello"})
    act(env, "think", thought="greet")
    assert env.verify() is False


def test_injected_tool_and_its_failures_become_observations():
    calls = []

    def kb(params):
        calls.append(params)
        if params.get("fail"):
            raise RuntimeError("index offline")
        return {"output": "partitions: 3", "exit_code": 0}

    env = ConversationEnv("engineering", tools={"knowledge_base": kb})
    env.reset(task="lag")
    assert act(env, "knowledge_base", q="partitions").observation == "partitions: 3"
    ts = act(env, "knowledge_base", fail=True)
    assert ts.info["exit_code"] == 1 and "index offline" in ts.observation and not ts.done
    assert calls == [{"q": "partitions"}, {"fail": True}]


def test_unknown_tool_is_an_error_not_the_end():
    env = ConversationEnv("conversation")
    env.reset(task="hi")
    ts = act(env, "bash", command="ls")
    assert ts.info["exit_code"] == 1 and "unknown tool 'bash'" in ts.observation and not ts.done


def test_truncated_at_max_turns_unless_terminated():
    env = ConversationEnv("conversation", max_turns=2)
    env.reset(task="hi")
    assert not act(env, "think").done
    ts = act(env, "web_search", query="x")
    assert ts.truncated and not ts.terminated
    env.reset(task="hi")
    act(env, "think")
    ts = act(env, "respond", response="bye")
    assert ts.terminated and not ts.truncated


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_turns": 0}, "max_turns"), ({"tools": {"x": 1}}, "tools"), ({"domain": ""}, "domain")],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(EnvError, match=message):
        ConversationEnv(**kwargs)


def test_bad_task_and_step_before_reset_raise():
    env = ConversationEnv()
    with pytest.raises(EnvError, match="before reset"):
        act(env, "respond")
    with pytest.raises(EnvError, match="user_message"):
        env.reset(task={"prompt": "hi"})


def test_builtin_tasks_run_and_verify():
    for task in builtin_tasks("conversation"):
        with task.make_env() as env:
            assert env.reset(task=task.reset_task).observation
            terminal = sorted(env.terminal_tools)[-1]
            ts = act(env, terminal, response=f"My answer mentions {task.task['expected'].upper()}.")
            assert ts.terminated and env.verify() is True, task.task_id
