"""Human calibration (reward layer 3): agreement metrics and a monotone map from judge to human scores.

Pure functions over plain floats: Pearson, Spearman, Kendall tau-b, pairwise ranking agreement and
mean absolute error; an isotonic fit by pool-adjacent-violators; `CalibrationMap`, the fitted
piecewise-linear map with a version, which the assembler applies to judge scores; `fit_by_key`
fits one map per (domain, rubric) and `calibration_event` is the `calibration.updated` event that
carries a map. The plot is the only I/O here (matplotlib, imported lazily). Reading scores and
labels and publishing maps is `human.py`; `agentstream calibrate` is infra/commands/judge.py.

>>> m = CalibrationMap(version="v1", domain="coding", rubric="overall", xs=[0.0, 1.0], ys=[0.2, 0.8])
>>> round(m.apply(0.5), 6)
0.5
>>> fit = fit_isotonic([0.1, 0.2, 0.3, 0.4], [0.0, 0.3, 0.2, 1.0])
>>> fit.ys
[0.0, 0.25, 0.25, 1.0]
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.events import CalibrationUpdated, utc_now
from schemas.ids import derived_event_id
from streams.errors import CalibrationError

PRODUCER = "agentstream-calibrate"


class CalibrationMap(BaseModel):
    """A monotone piecewise-linear map judge score -> calibrated score; clamped outside [xs[0], xs[-1]]."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: str
    domain: str = "generic"
    rubric: str = "overall"
    xs: list[float] = Field(default_factory=list)
    ys: list[float] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> CalibrationMap:
        if len(self.xs) != len(self.ys):
            raise ValueError(f"xs and ys differ in length ({len(self.xs)} != {len(self.ys)})")
        if any(b < a for a, b in zip(self.xs, self.xs[1:], strict=False)):
            raise ValueError(f"xs must be ascending, got {self.xs}")
        if any(b < a for a, b in zip(self.ys, self.ys[1:], strict=False)):
            raise ValueError(f"ys must be non-decreasing, got {self.ys}")
        return self

    def apply(self, score: float) -> float:
        """The calibrated score (identity when the map is empty), clamped to [0, 1]."""
        return _clamp01(interpolate(self.xs, self.ys, score))

    @classmethod
    def from_event(cls, event) -> CalibrationMap:
        """From a `CalibrationUpdated` event."""
        return cls(version=event.version, domain=event.domain, rubric=event.rubric, xs=event.xs, ys=event.ys)


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear interpolation through (xs, ys), flat outside; identity for no points."""
    if not xs:
        return x
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if x1 == x0:
        return y1
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, value))


# --- isotonic regression ------------------------------------------------------------------------


@dataclass(frozen=True)
class IsotonicFit:
    """Knots of the fitted non-decreasing function: one (x, y) per distinct x."""

    xs: list[float]
    ys: list[float]


def fit_isotonic(xs: Sequence[float], ys: Sequence[float]) -> IsotonicFit:
    """Least-squares non-decreasing fit of ys on xs (pool adjacent violators); ties in x are pooled."""
    _check_pairs(xs, ys, minimum=1)
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    blocks: list[list[float]] = []  # [sum_y, weight, x_lo, x_hi]
    for i in order:
        x, y = float(xs[i]), float(ys[i])
        if blocks and blocks[-1][3] == x:
            blocks[-1][0] += y
            blocks[-1][1] += 1
        else:
            blocks.append([y, 1.0, x, x])
    knot_x = [b[2] for b in blocks]
    pooled = _pool(blocks)
    knot_y = []
    for sum_y, weight, count in pooled:
        knot_y.extend([sum_y / weight] * count)
    return IsotonicFit(knot_x, [round(y, 12) for y in knot_y])


def _pool(blocks: list[list[float]]) -> list[list[float]]:
    """Merge adjacent blocks whose means decrease; returns [sum, weight, n_distinct_x] per block."""
    stack: list[list[float]] = []
    for sum_y, weight, _lo, _hi in blocks:
        stack.append([sum_y, weight, 1])
        while len(stack) > 1 and stack[-2][0] / stack[-2][1] > stack[-1][0] / stack[-1][1]:
            top = stack.pop()
            stack[-1] = [stack[-1][0] + top[0], stack[-1][1] + top[1], stack[-1][2] + top[2]]
    return stack


# --- agreement metrics --------------------------------------------------------------------------


def _check_pairs(xs: Sequence[float], ys: Sequence[float], minimum: int = 2) -> None:
    if len(xs) != len(ys):
        raise CalibrationError(f"automatic and human scores differ in length ({len(xs)} != {len(ys)})")
    if len(xs) < minimum:
        raise CalibrationError(f"need at least {minimum} score pairs, got {len(xs)}")


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation; nan when either side is constant (no information, not 0)."""
    _check_pairs(xs, ys)
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return float("nan")
    return sxy / math.sqrt(sxx * syy)


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks with ties averaged.

    >>> average_ranks([0.3, 0.1, 0.3])
    [2.5, 1.0, 2.5]
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rho: Pearson on average ranks."""
    _check_pairs(xs, ys)
    return pearson(average_ranks(xs), average_ranks(ys))


def _pair_signs(xs: Sequence[float], ys: Sequence[float]):
    n = len(xs)
    for i in range(n):
        for j in range(i + 1, n):
            yield _sign(xs[i] - xs[j]), _sign(ys[i] - ys[j])


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def kendall_tau_b(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Kendall's tau-b (tie-corrected); nan when either side is constant."""
    _check_pairs(xs, ys)
    concordant = discordant = ties_x = ties_y = 0
    for sx, sy in _pair_signs(xs, ys):
        if sx == 0 and sy == 0:
            continue
        if sx == 0:
            ties_x += 1
        elif sy == 0:
            ties_y += 1
        elif sx == sy:
            concordant += 1
        else:
            discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denominator if denominator else float("nan")


def pairwise_agreement(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Share of pairs the human ranks strictly whose order the judge reproduces (ties by the judge
    count half). Pairs the human ties are left out: they say nothing about ranking."""
    _check_pairs(xs, ys)
    agree = total = 0.0
    for sx, sy in _pair_signs(xs, ys):
        if sy == 0:
            continue
        total += 1
        agree += 1.0 if sx == sy else 0.5 if sx == 0 else 0.0
    return agree / total if total else float("nan")


def mean_absolute_error(xs: Sequence[float], ys: Sequence[float]) -> float:
    _check_pairs(xs, ys, minimum=1)
    return sum(abs(x - y) for x, y in zip(xs, ys, strict=True)) / len(xs)


def agreement_metrics(auto: Sequence[float], human: Sequence[float]) -> dict[str, float]:
    """Every agreement figure between automatic and human scores (nan where undefined)."""
    return {
        "pearson": pearson(auto, human),
        "spearman": spearman(auto, human),
        "kendall": kendall_tau_b(auto, human),
        "pairwise_agreement": pairwise_agreement(auto, human),
        "mae": mean_absolute_error(auto, human),
    }


# --- fitting a versioned map --------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationResult:
    """A fitted map with metrics before and after applying it (on the fitting data)."""

    map: CalibrationMap
    n: int
    before: dict[str, float]
    after: dict[str, float]
    pairs: list[tuple[float, float]] = field(default_factory=list)

    @property
    def metrics(self) -> dict[str, float]:
        """Flat metrics for the event: before as-is, after prefixed `calibrated_`; nan dropped."""
        flat = dict(self.before) | {f"calibrated_{k}": v for k, v in self.after.items()}
        flat["n"] = float(self.n)
        return {k: round(v, 6) for k, v in flat.items() if not math.isnan(v)}


def map_version(domain: str, rubric: str, xs: Sequence[float], ys: Sequence[float]) -> str:
    """A content-derived version: the same fit gives the same version (replays create no new map)."""
    text = f"{domain}\x1f{rubric}\x1f{list(xs)}\x1f{list(ys)}"
    return "cal-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def fit_calibration(
    auto: Sequence[float], human: Sequence[float], *, domain: str = "generic", rubric: str = "overall"
) -> CalibrationResult:
    """Fit an isotonic map from automatic to human scores and measure agreement before and after."""
    _check_pairs(auto, human)
    fit = fit_isotonic(auto, human)
    ys = [_clamp01(y) for y in fit.ys]
    version = map_version(domain, rubric, fit.xs, ys)
    cmap = CalibrationMap(version=version, domain=domain, rubric=rubric, xs=fit.xs, ys=ys)
    calibrated = [cmap.apply(a) for a in auto]
    return CalibrationResult(
        map=cmap,
        n=len(auto),
        before=agreement_metrics(auto, human),
        after=agreement_metrics(calibrated, human),
        pairs=list(zip(auto, human, strict=True)),
    )


def fit_by_key(
    by_key: Mapping[tuple[str, str], Sequence[tuple[float, float]]], min_pairs: int
) -> tuple[list[CalibrationResult], list[str]]:
    """One fit per (domain, rubric) with at least `min_pairs` (judge, human) pairs (and never fewer
    than 2), in key order; and one line per key left out, saying why.

    >>> results, skipped = fit_by_key({("coding", "overall"): [(0.1, 0.2), (0.9, 0.8)],
    ...                                ("coding", "tool_choice"): [(0.5, 0.5)]}, min_pairs=2)
    >>> [(r.map.domain, r.map.rubric, r.n) for r in results], skipped
    ([('coding', 'overall', 2)], ['coding/tool_choice: 1 label(s), need 2'])
    """
    results, skipped = [], []
    for (domain, rubric), matched in sorted(by_key.items()):
        if len(matched) < max(2, min_pairs):
            skipped.append(f"{domain}/{rubric}: {len(matched)} label(s), need {min_pairs}")
            continue
        auto, human = [a for a, _ in matched], [h for _, h in matched]
        try:
            results.append(fit_calibration(auto, human, domain=domain, rubric=rubric))
        except CalibrationError as exc:
            skipped.append(f"{domain}/{rubric}: {exc}")
    return results, skipped


def calibration_event(result: CalibrationResult, producer: str = PRODUCER) -> CalibrationUpdated:
    """The `calibration.updated` event of a fit; its id derives from the map's version, so
    publishing the same fit twice is one event to every reader."""
    cmap = result.map
    return CalibrationUpdated(
        event_id=derived_event_id("calibration.updated", cmap.version),
        trajectory_id=f"calibration:{cmap.domain}:{cmap.rubric}",
        occurred_at=utc_now(),
        producer=producer,
        version=cmap.version,
        domain=cmap.domain,
        rubric=cmap.rubric,
        xs=cmap.xs,
        ys=cmap.ys,
        metrics=result.metrics,
        n=result.n,
    )


def report_rows(results: Sequence[CalibrationResult]) -> list[dict]:
    """One flat row per (domain, rubric) for a printed table."""
    rows = []
    for r in results:
        row = {"domain": r.map.domain, "rubric": r.map.rubric, "n": r.n, "version": r.map.version}
        for key in ("pearson", "spearman", "kendall", "pairwise_agreement", "mae"):
            row[key] = r.before[key]
        row["mae_calibrated"] = r.after["mae"]
        rows.append(row)
    return rows


def reliability_plot(results: Sequence[CalibrationResult], path: str | Path, bins: int = 10) -> Path:
    """A PNG: per (domain, rubric), mean human score per judge-score bin, and the fitted map."""
    try:
        import matplotlib
    except ImportError:
        raise CalibrationError(
            "the reliability plot needs matplotlib (pip install 'agentstream[plot]')"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect agreement")
    for r in results:
        centres, means = _binned(r.pairs, bins)
        label = f"{r.map.domain}/{r.map.rubric}"
        ax.plot(centres, means, marker="o", linestyle="", label=f"{label} observed (n={r.n})")
        ax.plot(r.map.xs, r.map.ys, label=f"{label} isotonic map {r.map.version}")
    ax.set_xlabel("judge score")
    ax.set_ylabel("human score")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title("Judge reliability vs human labels")
    ax.legend(fontsize=7, loc="upper left")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _binned(pairs: Sequence[tuple[float, float]], bins: int) -> tuple[list[float], list[float]]:
    sums: dict[int, list[float]] = {}
    for a, h in pairs:
        b = min(bins - 1, int(a * bins))
        sums.setdefault(b, []).append(h)
    keys = sorted(sums)
    return [(k + 0.5) / bins for k in keys], [sum(sums[k]) / len(sums[k]) for k in keys]
