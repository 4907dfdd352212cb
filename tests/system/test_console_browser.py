"""The web console in a real headless Chromium (Debian's, through Playwright), against a real
embedded stack (`agentstream up`'s supervisor: broker, workers, sink, trainer, console) filled by the
scripted agents acting in the product's envs through the SDK (infra/bench/scripted.py).

What a user does and sees: filters chosen in the form end up in a shareable URL and every row shown
matches them; a trajectory opened from the list shows the same per-step scores as
`agentstream trajectory ID`; the overview's numbers move while events flow, without a reload; the
leaderboard shows what `agentstream leaderboard` prints; bad input is a 404 or 400 page, never a
stack trace; every page fits a phone's width. Screenshots of every page at 1280 and 390 px are left
in artifacts/console/ for a person to look at.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from infra.bench.scripted import plan, run_agents
from infra.clickhouse.sql import Sql
from infra.demo.run import wait_for_pipeline
from infra.stack import StackConfig, StackSupervisor, embedded_config
from schemas.topics import AGENT_EVENTS
from tests.support.browser import chromium
from tests.support.processes import AGENTSTREAM, REPO, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]

EPISODES, GROUP_SIZE, LIVE_EPISODES = 36, 3, 9
PAGE_SIZE = 4  # small, so that one domain's failures span several pages
REFRESH_S = 1
DESKTOP, PHONE = 1280, 390
LAYERS = ("rule", "judge", "human", "process")
HUMAN_STEP, HUMAN_SCORE = 1, 0.75
ARTIFACTS = REPO / "artifacts" / "console"
# The list's order (newest first), the same as the console's query.
FAILED_IN_DOMAIN = Sql(
    "SELECT trajectory_id FROM agentstream.trajectories FINAL "
    "WHERE domain = {domain:String} AND success = 0 "
    "ORDER BY coalesce(ended_at, occurred_at) DESC, trajectory_id"
)


@dataclass
class Console:
    config: StackConfig
    supervisor: StackSupervisor
    url: str
    domain: str  # the domain with the most failed episodes
    annotated: str  # the newest failed trajectory of `domain` that has a step HUMAN_STEP, labelled there

    def query(self, sql) -> list[tuple]:
        return self.config.query(sql)

    def run(self, *args: str) -> str:
        """`agentstream ARGS` with the stack's environment (as its components get it); its output."""
        env = {
            **os.environ,
            "AGENTSTREAM_CLICKHOUSE_URL": self.config.clickhouse_url,
            "AGENTSTREAM_BOOTSTRAP_SERVERS": self.config.bootstrap_servers,
        }
        done = subprocess.run(
            [*AGENTSTREAM, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"agentstream {' '.join(args)}: {done.stderr[-2000:]}"
        return done.stdout

    def cli(self, *args: str):
        """`agentstream ARGS --format json`, parsed."""
        return json.loads(self.run(*args, "--format", "json"))

    def goto(self, page, path: str, status: int = 200):
        """Open `path` in `page`; a status other than `status` fails with the console's log."""
        response = page.goto(self.url + path)
        if response.status != status:
            log = (self.config.data_dir / "logs" / "console.log").read_text(errors="replace")
            pytest.fail(
                f"GET /{path}: HTTP {response.status}, expected {status}; console log:\n{log[-4000:]}"
            )
        return response

    def trajectories(self) -> int:
        return self.query("SELECT uniqExact(trajectory_id) FROM agentstream.trajectories FINAL")[0][0]


class Poller(threading.Thread):
    """Restarts a component that exits while the tests run, as `agentstream up` would."""

    def __init__(self, supervisor: StackSupervisor):
        super().__init__(daemon=True)
        self.supervisor = supervisor
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            self.supervisor.poll()


@pytest.fixture(scope="module")
def console(tmp_path_factory) -> Iterator[Console]:
    data_dir = tmp_path_factory.mktemp("console") / "stack"
    config = embedded_config(
        data_dir,
        console=True,
        batch_args=("--group-size", str(GROUP_SIZE), "--flush-interval-s", "2", "--retokenize"),
        extra_env={"AGENTSTREAM_PAGE_SIZE": str(PAGE_SIZE), "AGENTSTREAM_REFRESH_S": str(REFRESH_S)},
    )
    supervisor = StackSupervisor(config)
    supervisor.start()
    poller = Poller(supervisor)
    try:
        rollouts = plan(EPISODES, GROUP_SIZE)
        run_agents(rollouts, config.bootstrap_servers, data_dir / "sdk")
        wait_for_pipeline(config, len(rollouts), supervisor)
        poller.start()
        stack = Console(config, supervisor, f"http://127.0.0.1:{config.console_port}/", "", "")
        assert stack.trajectories() == len(rollouts), "the scripted episodes did not all reach ClickHouse"
        stack.domain, failures = config.query(
            "SELECT domain, count() AS n FROM agentstream.trajectories FINAL WHERE success = 0 "
            "GROUP BY domain ORDER BY n DESC, domain LIMIT 1"
        )[0]
        assert failures > PAGE_SIZE, "the scripted data gives the failed-episode list a single page"
        stack.annotated = _with_human_step(stack, _failed_in(stack, stack.domain)[:PAGE_SIZE])
        _annotate(stack, stack.annotated)
        yield stack
    finally:
        poller.stopping.set()
        if poller.is_alive():
            poller.join()
        supervisor.stop()


def _failed_in(stack: Console, domain: str) -> list[str]:
    return [r[0] for r in stack.query(Sql(FAILED_IN_DOMAIN.text, {"domain": domain}))]


def _with_human_step(stack: Console, newest_first: list[str]) -> str:
    """The first of `newest_first` (the list's first page) that took a step HUMAN_STEP. A scripted
    episode can end at its first step (a wrong first guess is submitted), and a label on a step that
    was never taken shows as a step with a human score and no rule score: the data would be right,
    the test's choice wrong."""
    took = Sql(
        "SELECT DISTINCT trajectory_id FROM agentstream.steps FINAL "
        "WHERE trajectory_id IN {ids:Array(String)} AND step_index = {step:UInt32}",
        {"ids": newest_first, "step": HUMAN_STEP},
    )
    labelled = {row[0] for row in stack.query(took)}
    chosen = [tid for tid in newest_first if tid in labelled]
    assert chosen, f"no failed trajectory on the list's first page has a step {HUMAN_STEP}: {newest_first}"
    return chosen[0]


def _annotate(stack: Console, trajectory_id: str) -> None:
    """A human label on one step, published with `agentstream annotate`; waits until ClickHouse has
    it and the trajectory it re-scored (so that the pages and the CLI read the same revision)."""
    state = Sql(
        "SELECT max(revision), "
        "(SELECT count() FROM agentstream.annotations WHERE trajectory_id = {tid:String}) "
        "FROM agentstream.trajectories WHERE trajectory_id = {tid:String}",
        {"tid": trajectory_id},
    )
    before = stack.query(state)[0][0]
    label = ("--step", str(HUMAN_STEP), "--score", str(HUMAN_SCORE), "--annotator", "browser-test")
    stack.run("annotate", "--trajectory", trajectory_id, *label)

    def landed() -> bool:
        revision, labels = stack.query(state)[0]
        return revision > before and labels > 0

    wait_for(
        landed,
        timeout_s=60,
        interval_s=0.3,
        what="the human label and the trajectory it re-scored",
    )


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser):
    """A fresh desktop-width tab (its own cookies and cache)."""
    context = browser.new_context(viewport={"width": DESKTOP, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()


# --- 1. the list filters -------------------------------------------------------------------------


def test_list_filters_go_into_a_shareable_url_and_every_row_matches(console, page, browser):
    console.goto(page, "trajectories")
    form = page.locator("form.filters")
    form.locator("select[name=domain]").select_option(console.domain)
    form.locator("select[name=success]").select_option("false")
    with page.expect_navigation():
        form.locator("button[type=submit]").click()

    assert _query(page.url) == {"domain": console.domain, "success": "false"}
    assert form.locator("select[name=domain]").input_value() == console.domain
    assert form.locator("select[name=success]").input_value() == "false"
    expected = _failed_in(console, console.domain)
    pages = math.ceil(len(expected) / PAGE_SIZE)
    assert page.get_by_test_id("total").inner_text() == f"{len(expected)} found"
    assert " ".join(page.get_by_test_id("pages").inner_text().split()) == f"page 1 of {pages} older →"
    first = _rows(page)
    assert [r["id"] for r in first] == expected[:PAGE_SIZE]
    _assert_rows_match(first, console.domain)

    with page.expect_navigation():
        page.locator("a[rel=next]").click()
    # the link carries the filters and the page, not the console's own page size
    assert _query(page.url) == {"domain": console.domain, "success": "false", "page": "2"}
    second = _rows(page)
    assert [r["id"] for r in second] == expected[PAGE_SIZE : 2 * PAGE_SIZE]
    _assert_rows_match(second, console.domain)
    assert page.locator("a[rel=prev]").count() == 1

    shared = browser.new_context(viewport={"width": DESKTOP, "height": 900})  # someone given the link
    try:
        other = shared.new_page()
        other.goto(page.url)
        assert [r["id"] for r in _rows(other)] == [r["id"] for r in second]
    finally:
        shared.close()


def _query(url: str) -> dict[str, str]:
    parsed = parse_qs(urlsplit(url).query, keep_blank_values=True)
    assert all(len(v) == 1 for v in parsed.values()), url
    return {k: v[0] for k, v in parsed.items()}


def _rows(page) -> list[dict]:
    """The list's rows: trajectory id and the text of each cell, by column heading."""
    return page.evaluate(
        """() => {
          const heads = [...document.querySelectorAll('[data-testid=trajectory-list] thead th')]
            .map(th => th.textContent.trim());
          return [...document.querySelectorAll('[data-testid=trajectory-list] tr[data-trajectory-id]')]
            .map(tr => {
              const cells = {};
              [...tr.children].forEach((td, i) => { cells[heads[i]] = td.textContent.trim(); });
              return {id: tr.dataset.trajectoryId, cells};
            });
        }"""
    )


def _assert_rows_match(rows: list[dict], domain: str) -> None:
    assert rows, "the filtered list shows no rows"
    for row in rows:
        assert row["cells"]["domain"] == domain, row
        assert row["cells"]["success"] == "no", row


# --- 2. one trajectory, against the CLI ----------------------------------------------------------


def test_a_trajectory_opened_from_the_list_shows_the_clis_scores_per_step(console, page):
    console.goto(page, "trajectories?" + urlencode({"domain": console.domain, "success": "false"}))
    with page.expect_navigation():
        page.locator(f'tr[data-trajectory-id="{console.annotated}"] td.task a').click()
    assert urlsplit(page.url).path == f"/trajectories/{console.annotated}"
    assert page.get_by_test_id("trajectory-id").inner_text() == console.annotated

    cli = console.cli("trajectory", console.annotated)
    shown = _step_scores(page)
    assert [s["step"] for s in shown] == [s["step"] for s in cli["steps"]]
    for want, got in zip(cli["steps"], shown, strict=True):
        for layer in LAYERS:
            cell = got["layers"][layer]
            where = f"step {want['step']} {layer}: {cell}"
            if want[layer] is None:
                assert cell["absent"] and cell["score"] is None, where
                assert not re.search(r"\d", cell["text"]), f"an absent layer shows a number: {where}"
            else:
                assert not cell["absent"] and cell["score"] == f"{want[layer]:.3f}", where
    assert page.locator("[data-field=total_reward]").inner_text() == f"{cli['episode']['total_reward']:.3f}"
    # the data has both kinds: a layer present on every step, one on one step, one on none
    assert all(s["rule"] is not None for s in cli["steps"])
    assert [s["step"] for s in cli["steps"] if s["human"] is not None] == [HUMAN_STEP]
    assert cli["steps"][HUMAN_STEP]["human"] == pytest.approx(HUMAN_SCORE)
    assert all(s["judge"] is None for s in cli["steps"])  # this stack runs no judge


def _step_scores(page) -> list[dict]:
    return page.evaluate(
        """(layers) => [...document.querySelectorAll('li.step[data-step]')].map(li => ({
          step: parseInt(li.dataset.step, 10),
          layers: Object.fromEntries(layers.map(name => {
            const el = li.querySelector(`[data-layer="${name}"]`);
            const score = el && el.querySelector('.score');
            return [name, {
              text: el ? el.textContent.trim() : '',
              score: score ? score.textContent.trim() : null,
              absent: !!(el && el.querySelector('.absent')),
            }];
          })),
        }))""",
        list(LAYERS),
    )


# --- 3. the overview is live ---------------------------------------------------------------------

EVENTS = '[data-field="counts.events"]'
TOPIC_RECORDS = f'#topics tr[data-topic="{AGENT_EVENTS}"] [data-field="records"]'
NUMBER_ABOVE = """([selector, floor]) => {
  const el = document.querySelector(selector);
  return !!el && parseInt(el.textContent.replace(/[^0-9]/g, '') || '0', 10) > floor;
}"""


def test_the_overview_numbers_move_while_events_flow_without_a_reload(console, page):
    console.goto(page, "")
    page.wait_for_selector(TOPIC_RECORDS)
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    events, records = _number(page, EVENTS), _number(page, TOPIC_RECORDS)
    assert events > 0 and records > 0

    expected = console.trajectories() + LIVE_EPISODES
    run_agents(
        plan(LIVE_EPISODES, GROUP_SIZE),
        console.config.bootstrap_servers,
        console.config.data_dir / "sdk-live",
    )
    page.wait_for_function(NUMBER_ABOVE, arg=[EVENTS, events], timeout=30_000)
    page.wait_for_function(NUMBER_ABOVE, arg=[TOPIC_RECORDS, records], timeout=30_000)
    assert page.evaluate("window.__sameDocument === true"), "the overview reloaded instead of updating"
    # every episode the agents published reaches the console's numbers
    wait_for(
        lambda: console.trajectories() >= expected, timeout_s=60, interval_s=0.5, what="the new episodes"
    )
    page.wait_for_function(
        NUMBER_ABOVE, arg=['[data-field="counts.trajectories"]', expected - 1], timeout=15_000
    )


def _number(page, selector: str) -> int:
    return int(re.sub(r"[^0-9]", "", page.locator(selector).inner_text()) or 0)


# --- 4. the leaderboard, against the CLI ---------------------------------------------------------


def test_the_leaderboard_page_shows_what_the_cli_prints(console, page):
    console.goto(page, "leaderboard?by=model")
    assert page.locator("select[name=by]").input_value() == "model"
    shown = page.evaluate(
        """() => [...document.querySelectorAll('[data-testid=leaderboard] tbody tr')]
                  .map(tr => [...tr.children].map(td => td.textContent.trim()))"""
    )
    cli = console.cli("leaderboard", "--by", "model")
    assert cli, "the CLI's leaderboard is empty"
    expected = [
        [
            r["domain"],
            r["model"],
            f"{r['episodes']:,}",
            f"{100 * r['success_rate']:.1f}%",
            f"{r['mean_reward']:.3f}",
            f"[{r['ci95_low']:.3f}, {r['ci95_high']:.3f}]",
        ]
        for r in cli
    ]
    assert [row[:6] for row in shown] == expected


# --- 5. bad input --------------------------------------------------------------------------------


def test_an_unknown_trajectory_is_a_404_page(console, page):
    console.goto(page, "trajectories/no-such-id", status=404)
    error = page.get_by_test_id("error")
    assert "404" in error.inner_text() and "no-such-id" in error.inner_text()
    assert "Traceback" not in page.content()


def test_a_malformed_filter_is_a_400_page_naming_the_field_and_the_value(console, page):
    console.goto(page, "trajectories?reward_min=abc", status=400)
    message = page.get_by_test_id("error").locator(".message").inner_text()
    assert "reward_min" in message and "abc" in message, message
    assert "Traceback" not in page.content()


# --- 6. screenshots and the phone width ----------------------------------------------------------

SCREENS = {
    "overview": "",
    "trajectories": "trajectories",
    "trajectory": "trajectories/{annotated}",
    "leaderboard": "leaderboard",
    "training": "training",
    "not-found": "trajectories/no-such-id",
}
# Measured against the viewport's width, not innerWidth: a phone browser widens its layout viewport
# to fit content that overflows, which would hide the overflow from innerWidth.
OVERFLOW = """(width) => {
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.parentElement && el.parentElement.closest('.scroll')) continue;  // scrolls inside its box
    const right = el.getBoundingClientRect().right;
    if (right > width + 1) {
      const cls = (el.getAttribute('class') || '').trim().split(/\\s+/).filter(Boolean).join('.');
      out.push(`${el.tagName.toLowerCase()}${cls ? '.' + cls : ''} right=${Math.round(right)}`);
    }
  }
  return {
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
    offenders: out.slice(0, 8),
  };
}"""


@pytest.mark.parametrize("width", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_every_page_fits_its_width_and_is_screenshotted(console, browser, width):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    phone = width == PHONE
    context = browser.new_context(
        viewport={"width": width, "height": 844 if phone else 900}, is_mobile=phone, has_touch=phone
    )
    overflowing = {}
    try:
        tab = context.new_page()
        for name, path in SCREENS.items():
            console.goto(tab, path.format(annotated=console.annotated), 404 if name == "not-found" else 200)
            tab.wait_for_load_state("load")
            shot = ARTIFACTS / f"{name}-{width}.png"
            tab.screenshot(path=str(shot), full_page=True)
            assert _png_size(shot)[0] == width, shot
            layout = tab.evaluate(OVERFLOW, width)
            if max(layout["scrollWidth"], layout["innerWidth"]) > width + 1:
                overflowing[name] = layout
    finally:
        context.close()
    assert overflowing == {}, f"pages wider than {width} px outside .scroll boxes: {overflowing}"


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", path
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
