"""The evaluation statistics against scipy and hand-computed values: exact McNemar (binomial test on
the discordant pairs), the paired bootstrap, Holm's step-down, unbiased pass@k and Wilson."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from infra.evaluation.outcomes import Outcome, compare_all, compare_pair, pass_at_ks, summarize
from infra.evaluation.stats import (
    MAX_RESAMPLES,
    holm,
    mcnemar_exact,
    paired_bootstrap,
    pass_at_k,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("a_only", "b_only", "same"), [(6, 1, 10), (0, 5, 3), (12, 12, 0), (9, 2, 40), (0, 0, 7)]
)
def test_mcnemar_equals_scipys_binomial_test_on_the_discordant_pairs(a_only, b_only, same):
    a = [1] * a_only + [0] * b_only + [1] * same
    b = [0] * a_only + [1] * b_only + [1] * same
    result = mcnemar_exact(a, b)
    assert (result.a_only, result.b_only) == (a_only, b_only)
    n = a_only + b_only
    expected = stats.binomtest(a_only, n, 0.5).pvalue if n else 1.0
    assert result.p_value == pytest.approx(expected, rel=1e-12)
    for alternative in ("less", "greater"):
        one = mcnemar_exact(a, b, alternative).p_value
        assert one == pytest.approx(stats.binomtest(a_only, n, 0.5, alternative).pvalue if n else 1.0)


def test_mcnemar_hand_computed_and_refusals():
    # 7 discordant pairs, all for A: 2 * 0.5**7
    assert mcnemar_exact([1] * 7, [0] * 7).p_value == pytest.approx(2 / 128)
    # concordant pairs carry no information: adding 100 agreeing ones changes nothing
    assert mcnemar_exact([1] * 7 + [1] * 100, [0] * 7 + [1] * 100).p_value == pytest.approx(2 / 128)
    with pytest.raises(ValueError, match="3 and 2 episodes"):
        mcnemar_exact([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="alternative='bigger'"):
        mcnemar_exact([1], [0], "bigger")  # type: ignore[arg-type]


def test_holm_matches_the_textbook_step_down():
    # sorted 0.01, 0.02, 0.03, 0.04 with m = 4: 0.04, 0.06, 0.06, 0.06
    assert holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    got = holm([0.2, math.nan, 0.01])
    assert got[0] == pytest.approx(0.2) and math.isnan(got[1]) and got[2] == pytest.approx(0.02)
    # against statsmodels' definition computed by hand: p_(i) * (m - i + 1), running max, capped at 1
    rng = random.Random(3)
    ps = [rng.random() / 10 for _ in range(6)]
    order = sorted(range(6), key=ps.__getitem__)
    expected, running = [0.0] * 6, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (6 - rank) * ps[i]))
        expected[i] = running
    assert holm(ps) == pytest.approx(expected)


def test_pass_at_k_is_the_unbiased_estimator():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the success rate
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0
    with pytest.raises(ValueError, match="k=6"):
        pass_at_k(5, 2, 6)
    with pytest.raises(ValueError, match="successes=6"):
        pass_at_k(5, 6, 1)
    outcomes = [Outcome("a", i, i, i < 2, 0.0) for i in range(4)] + [
        Outcome("b", i, i, False, 0.0) for i in range(4)
    ]
    # task a: pass@2 = 1 - C(2,2)/C(4,2) = 5/6; task b: 0
    assert pass_at_ks(outcomes, [1, 2]) == pytest.approx({1: 0.25, 2: 5 / 12})


def test_wilson_interval_matches_the_textbook_values():
    assert [round(x, 4) for x in wilson_interval(8, 10)] == [0.4902, 0.9433]
    low, high = wilson_interval(50, 100)
    assert (round(low, 4), round(high, 4)) == (0.4038, 0.5962)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_paired_bootstrap_is_seeded_centred_and_detects_a_real_difference():
    rng = random.Random(0)
    a = [rng.random() for _ in range(60)]
    shifted = [x + 0.3 for x in a]
    noisy = [x + rng.gauss(0, 0.05) for x in a]
    one = paired_bootstrap(shifted, a, resamples=2000, seed=7)
    assert one == paired_bootstrap(shifted, a, resamples=2000, seed=7)  # seeded: the same figures
    assert one.difference == pytest.approx(0.3) and one.low == pytest.approx(0.3) and one.p_value < 0.001
    none = paired_bootstrap(noisy, a, resamples=2000, seed=7)
    assert none.low < 0 < none.high and none.p_value > 0.05
    # the interval of a clear difference excludes 0 and contains the observed mean
    mixed = [x + 0.1 + rng.gauss(0, 0.1) for x in a]
    r = paired_bootstrap(mixed, a, resamples=2000, seed=1)
    assert 0 < r.low < r.difference < r.high and r.p_value < 0.01
    with pytest.raises(ValueError, match="2 and 1 episodes"):
        paired_bootstrap([1.0, 2.0], [1.0])


def test_pairs_follow_task_and_sample_not_list_order():
    a = [Outcome("t1", 0, 0, True, 1.0), Outcome("t2", 0, 0, True, 1.0), Outcome("t1", 1, 1, False, 0.0)]
    b = list(
        reversed(
            [Outcome("t1", 0, 0, False, 0.0), Outcome("t2", 0, 0, True, 1.0), Outcome("t1", 1, 1, True, 1.0)]
        )
    )
    c = compare_pair("A", a, "B", b, resamples=100)
    assert (c.pairs, c.a_only, c.b_only, c.difference) == (3, 1, 1, 0.0)
    # a greedy episode is never paired with a sampled one
    g = compare_pair(
        "A", [Outcome("t1", 0, 0, True, 1.0, greedy=True)], "B", [Outcome("t1", 0, 0, False, 0.0)], 10
    )
    assert g.pairs == 0 and math.isnan(g.mcnemar_p) and g.verdict == "no significant difference"


def test_three_policies_are_holm_corrected_across_the_three_pairs():
    def policy(wins: int) -> list[Outcome]:
        return [Outcome(f"t{i}", 0, 0, i < wins, float(i < wins)) for i in range(12)]

    pairs = compare_all([("A", policy(12)), ("B", policy(6)), ("C", policy(5))], resamples=500)
    assert [(c.a, c.b) for c in pairs] == [("A", "B"), ("A", "C"), ("B", "C")]
    raw = [stats.binomtest(k, n, 0.5).pvalue for k, n in ((6, 6), (7, 7), (1, 1))]
    assert [c.mcnemar_p for c in pairs] == pytest.approx(raw)
    assert [c.holm_p for c in pairs] == pytest.approx([min(1, 2 * raw[0]), 3 * raw[1], 1.0])
    assert [c.verdict for c in pairs] == [
        "no significant difference",
        "A better",
        "no significant difference",
    ]
    assert pairs[1].holm_p > pairs[1].mcnemar_p  # the correction moved it


def test_summary_keeps_greedy_apart():
    outcomes = [Outcome("t", i, i, i == 0, float(i == 0)) for i in range(4)] + [
        Outcome("t", 0, 0, True, 1.0, True)
    ]
    s = summarize("A", outcomes, ks=(1, 4))
    assert (s.episodes, s.successes, s.greedy_episodes, s.greedy_successes) == (4, 1, 1, 1)
    assert s.rate == 0.25 and s.greedy_rate == 1.0 and s.pass_at == {1: 0.25, 4: 1.0}


def test_paired_bootstrap_refuses_resamples_it_cannot_hold_and_a_negative_seed():
    with pytest.raises(ValueError, match="resamples=1000000000000: must be between 1 and 1000000"):
        paired_bootstrap([1.0, 0.0], [0.0, 0.0], resamples=10**12)  # was a MemoryError
    with pytest.raises(ValueError, match="seed=-1"):
        paired_bootstrap([1.0, 0.0], [0.0, 0.0], resamples=10, seed=-1)
    assert paired_bootstrap([1.0, 0.0], [0.0, 0.0], resamples=MAX_RESAMPLES // 1000).resamples == 1000
