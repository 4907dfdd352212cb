"""What `agentstream bench console` puts in ClickHouse, and how.

Trajectories of varied domain, agent, model, policy version (v0..v9), success (NULL too), reward and
task text over four days; a fifth also have an earlier revision in another part (what FINAL merges),
each has its episode row (`episode_outcomes` joins them) and `--filler-steps` steps, rule rewards and
judge verdicts. One more (`LONG_ID`) has `--steps` steps (2 KB observations) with a rule reward and
judge verdicts each, annotations and process scores. The rows are pure generators over a seeded
`random.Random`; `load` inserts them in batches and `settle` waits for the merges.
"""

from __future__ import annotations

import functools
import json
import random
import time
from datetime import UTC, datetime, timedelta

from infra.terminal.output import say

LONG_ID = "bench-long-trajectory"
SEED = 20261125
BATCH = 20_000
START = datetime(2026, 11, 20, tzinfo=UTC)


def _names(text: str) -> list[str]:
    return text.split()


DOMAINS = ("code", "math", "web", "sql", "calc", "support")
AGENTS = ("swe-agent", "react", "planner", "toolformer", "reflexion", "coder-lite", "browser", "solver")
MODELS = ("qwen2.5-7b", "llama-3.1-8b", "mistral-7b", "claude-haiku", "gpt-4o-mini")
TOOLS = ("bash", "python", "read_file", "write_file", "search", "browser", "sql")
WORDS = _names(
    "fix add refactor parse compute find list sort merge split count check build deploy migrate query "
    "render test debug profile cache index rename remove update fetch load save report plot summarise "
    "the a every each all failing broken slow flaky nested empty large small duplicate missing stale "
    "function class module table column row file directory config parser tokenizer scheduler request "
    "response header cookie session user order invoice payment account price discount shipment item "
    "graph tree list queue stack matrix vector integer prime fraction equation integral derivative sum "
    "average median variance histogram csv json yaml xml html page link form button search result "
    "error warning timeout retry limit offset cursor batch stream event log metric trace span alert "
    "in for with from into by after before without using across between under over per of to"
)
SEARCH_WORD = "invoice"

COLUMNS = {  # per table: the columns its rows below fill, in order
    "trajectories": _names(
        "trajectory_id revision event_id occurred_at task_id task domain agent model policy_version "
        "group_id success total_steps outcome_score process_score efficiency_score total_reward complete "
        "missing reward_version calibration_version started_at ended_at step_process_scores steps metadata"
    ),
    "episodes": _names(
        "trajectory_id task_id task domain agent model policy_version group_id started_at ended_at "
        "success score total_steps"
    ),
    "steps": _names(
        "event_id trajectory_id step_index occurred_at thought tool params observation exit_code error "
        "model policy_version input_tokens output_tokens latency_ms sampled_tokens producer"
    ),
    "rule_rewards": _names(
        "event_id trajectory_id step_index occurred_at redundancy regression info_utilization score "
        "domain reward_version source_event_id"
    ),
    "judge_scores": _names(
        "event_id trajectory_id kind step_index occurred_at scores score rationale judge_model "
        "prompt_version input_tokens output_tokens cost_usd latency_ms cached group_id mode "
        "source_event_id failure_reason failure_kind attempts"
    ),
    "annotations": _names(
        "event_id trajectory_id step_index occurred_at rubric score annotator comment producer"
    ),
}


def task_text(rng: random.Random, length: int = 80) -> str:
    """A task of about `length` characters of varied words.

    >>> len(task_text(random.Random(1))) >= 80
    True
    """
    words, size = [], -1
    while size < length:
        words.append(rng.choice(WORDS))
        size += len(words[-1]) + 1
    return " ".join(words).capitalize()


@functools.lru_cache
def _pool(chars: int) -> tuple[str, ...]:
    rng = random.Random(SEED + chars)
    return tuple(task_text(rng, chars) for _ in range(512))


def text(rng: random.Random, chars: int) -> str:
    """A text of about `chars` characters from a pool (steps and verdicts need not all differ)."""
    return rng.choice(_pool(chars))


def trajectory_row(i: int, rng: random.Random, revision: int = 2) -> list:
    """One `agentstream.trajectories` row (column order: `COLUMNS["trajectories"]`) for trajectory `i`;
    revision 1 is an earlier, incomplete one."""
    ended = START + timedelta(seconds=rng.uniform(0, 4 * 86_400))
    started = ended - timedelta(seconds=rng.uniform(5, 900))
    roll = rng.random()
    success = 1 if roll < 0.45 else (0 if roll < 0.85 else None)
    reward = None if success is None and rng.random() < 0.5 else round(rng.random(), 4)
    missing = [] if revision == 2 and rng.random() < 0.95 else [rng.choice(("judge", "human"))]
    steps = rng.randint(1, 40)
    return [
        f"traj-{i:07d}", revision, f"scored-{i}-{revision}", ended + timedelta(seconds=revision),
        f"task-{i % 5000}", task_text(rng), DOMAINS[i % len(DOMAINS)], rng.choice(AGENTS), rng.choice(MODELS),
        f"v{rng.randrange(10)}", f"group-{i // 8}", success, steps,
        None if success is None else float(success), rng.random(), rng.random(), reward, int(not missing),
        missing, "rv3", None, started, ended, [], "", "{}",
    ]  # fmt: skip


def episode_row(trajectory: list) -> list:
    """The `agentstream.episodes` row  of a trajectory row."""
    t = dict(zip(COLUMNS["trajectories"], trajectory, strict=True))
    score = None if t["total_reward"] is None else round(t["total_reward"] * 0.9, 4)
    return [t["trajectory_id"], t["task_id"], t["task"], t["domain"], t["agent"], t["model"],
            t["policy_version"], t["group_id"], t["started_at"], t["ended_at"], t["success"], score,
            t["total_steps"]]  # fmt: skip


def step_row(tid: str, index: int, rng: random.Random, observation_chars: int, at: datetime) -> list:
    """One `agentstream.steps` row ."""
    tool = rng.choice(TOOLS)
    failed = index % 7 == 6
    params = json.dumps({"cmd": f"{tool} {rng.choice(WORDS)}_{index}.py", "timeout": 30})
    return [
        f"{tid}-s{index}", tid, index, at, text(rng, 160), tool, params, text(rng, observation_chars),
        1 if failed else 0, "exit status 1" if failed else None,
        "qwen2.5-7b", "v3", rng.randint(200, 4000), rng.randint(10, 400), rng.uniform(50, 3000), 0, "bench",
    ]  # fmt: skip


def rule_row(tid: str, index: int, rng: random.Random, at: datetime, domain: str = "code") -> list:
    """One `agentstream.rule_rewards` row ."""
    return [f"{tid}-r{index}", tid, index, at, rng.random(), rng.random(), rng.random(), rng.random(),
            domain, "rv3", f"{tid}-s{index}"]  # fmt: skip


def judge_row(tid: str, index: int | None, rng: random.Random, at: datetime, kind: str = "step") -> list:
    """One `agentstream.judge_scores` row ; kind 'step', 'trajectory' or 'failed'."""
    failed = kind == "failed"
    scores = {} if failed else {"correctness": rng.random(), "progress": rng.random()}
    return [
        f"{tid}-j{kind}{index}", tid, kind, index, at, scores, None if failed else rng.random(),
        "" if failed else text(rng, 300), "claude-haiku", "judge-v2", 900, 120, 0.0004,
        rng.uniform(300, 2000), 0, None, "single", f"{tid}-s{index}",
        "judge answered with no score after 3 attempts" if failed else "", "unparseable" if failed else "",
        3 if failed else 1,
    ]  # fmt: skip


def long_trajectory(steps: int) -> dict[str, list[list]]:
    """Rows per table of the trajectory whose page is timed: `steps` steps with 2 KB observations,
    a rule reward and a judge verdict per step (and a failed verdict every tenth), annotations."""
    rng = random.Random(SEED + 1)
    at = [START + timedelta(days=2, seconds=10 * i) for i in range(steps + 1)]
    header = dict(zip(COLUMNS["trajectories"], trajectory_row(0, rng), strict=True))
    header.update(trajectory_id=LONG_ID, event_id=f"scored-{LONG_ID}", domain="code", total_steps=steps,
                  success=1, total_reward=0.82, complete=1, missing=[], started_at=at[0], ended_at=at[-1],
                  step_process_scores=[round(rng.random(), 4) for _ in range(steps)])  # fmt: skip
    judge = [judge_row(LONG_ID, i, rng, at[i]) for i in range(steps)]
    judge += [judge_row(LONG_ID, i, rng, at[i], "failed") for i in range(0, steps, 10)]
    judge.append(judge_row(LONG_ID, None, rng, at[-1], "trajectory"))
    notes = [
        [
            f"{LONG_ID}-a{i}",
            LONG_ID,
            i,
            at[i],
            "helpfulness",
            0.25 * (i % 5),
            "ann@example.com",
            "the observation shows the test passing",
            "console",
        ]
        for i in range(0, steps, max(1, steps // 4))
    ]
    notes.append(
        [f"{LONG_ID}-a-all", LONG_ID, None, at[-1], "overall", 0.8, "ann@example.com", "good", "console"]
    )
    return {
        "trajectories": [list(header.values())],
        "episodes": [episode_row(list(header.values()))],
        "steps": [step_row(LONG_ID, i, rng, 2048, at[i]) for i in range(steps)],
        "rule_rewards": [rule_row(LONG_ID, i, rng, at[i]) for i in range(steps)],
        "judge_scores": judge,
        "annotations": notes,
    }  # fmt: skip


def filler_rows(trajectories: list[list], per_trajectory: int, rng: random.Random) -> dict[str, list[list]]:
    """`per_trajectory` short steps, with a rule reward and a judge verdict each, per trajectory row."""
    out: dict[str, list[list]] = {"steps": [], "rule_rewards": [], "judge_scores": []}
    for row in trajectories:
        tid, domain, ended = row[0], row[6], row[22]
        for k in range(per_trajectory):
            at = ended - timedelta(seconds=5 * (per_trajectory - k))
            out["steps"].append(step_row(tid, k, rng, 200, at))
            out["rule_rewards"].append(rule_row(tid, k, rng, at, domain))
            out["judge_scores"].append(judge_row(tid, k, rng, at))
    return out


# --- I/O: insert, serve, request -------------------------------------------------------------------


def _insert(client, table: str, rows: list[list], counts: dict[str, int]) -> None:
    from clients.clickhouse import DATABASE

    if rows:
        client.insert(f"{DATABASE}.{table}", rows, column_names=COLUMNS[table])
        counts[table] = counts.get(table, 0) + len(rows)


def load(client, trajectories: int, steps: int, filler: int) -> dict:
    """Insert the trajectories in batches of `BATCH` (each batch's earlier revisions first, in a part
    of their own), then the long trajectory; returns the seconds taken and the rows per table."""
    started, rng, counts = time.monotonic(), random.Random(SEED), {}
    for first in range(0, trajectories, BATCH):
        ids = range(first, min(first + BATCH, trajectories))
        _insert(
            client, "trajectories", [trajectory_row(i, rng, revision=1) for i in ids if i % 5 == 0], counts
        )
        rows = [trajectory_row(i, rng) for i in ids]
        _insert(client, "trajectories", rows, counts)
        _insert(client, "episodes", [episode_row(r) for r in rows], counts)
        for table, extra in filler_rows(rows, filler, rng).items():
            _insert(client, table, extra, counts)
        elapsed = time.monotonic() - started
        say(f"[console] {ids[-1] + 1:,} / {trajectories:,} trajectories inserted ({elapsed:.1f} s)")
    for table, rows in long_trajectory(steps).items():
        _insert(client, table, rows, counts)
    seconds = time.monotonic() - started
    say(f"[console] {steps}-step trajectory inserted; {sum(counts.values()):,} rows, {seconds:.1f} s")
    return {"insert_s": round(seconds, 2), "rows": counts}


def settle(client, timeout_s: float = 120.0) -> float:
    """Wait (at most `timeout_s`) until no merge is running, so the requests do not race the merges
    of the parts just inserted; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if int(client.query("SELECT count() FROM system.merges").result_rows[0][0]) == 0:
            break
        time.sleep(0.5)
    return round(time.monotonic() - started, 2)
