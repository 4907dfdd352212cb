"""Golden values for GRPO's off-policy maths: whole-group staleness admission (versions numbered by
`schemas.policy_versions`),
truncated importance weights (plain and tensor), ESS, the learning-rate schedule, and the sign of
the GRPO / KL gradients."""

from __future__ import annotations

import itertools
import math

import pytest

from consumers.errors import ConsumerConfigError
from consumers.training.config import TrainConfig
from consumers.training.losses import grpo_loss, importance_sums, tis_weights
from consumers.training.offpolicy import (
    admit_groups,
    effective_sample_size,
    importance_metrics,
    learning_rate_at,
    truncated_weight,
)


def test_a_missing_version_is_base_and_base_is_behind_every_numbered_version():
    rows = [{"group_id": g, "policy_version": v} for g, v in (("a", "base"), ("b", None), ("c", ""))]
    assert admit_groups(rows, "v9", max_staleness=2).dropped_groups == 3  # base is 9 behind v9
    fresh = admit_groups(rows, "v1", max_staleness=2)
    assert fresh.dropped_groups == 0 and fresh.staleness_histogram == {"1": 3}


def _row(group, version, key="policy_version", tid=None):
    return {"group_id": group, key: version, "trajectory_id": tid or f"{group}-{version}"}


def test_a_group_is_admitted_or_dropped_whole_by_its_oldest_version():
    rows = [
        _row("a", "v4", tid="a1"), _row("a", "v1", tid="a2"),  # oldest v1: 5 - 1 = 4 > 2, dropped
        _row("b", "v3", tid="b1"), _row("b", "v5", tid="b2"),  # oldest v3: staleness 2, admitted
        _row("c", "v5", key="behaviour_version"),  # token rows carry behaviour_version
    ]  # fmt: skip
    out = admit_groups(rows, "v5", max_staleness=2)
    assert [r["trajectory_id"] for r in out.rows] == ["b1", "b2", "c-v5"]
    assert (out.trained_groups, out.dropped_groups) == (2, 1)
    assert out.staleness_histogram == {"0": 1, "2": 1}
    assert out.behaviour_versions == ["v3", "v5"]
    assert not admit_groups(rows[:2], "v5", max_staleness=3).rows  # a: staleness 4, still whole
    assert len(admit_groups(rows[:2], "v5", max_staleness=4).rows) == 2


def test_rows_without_group_are_their_own_group_and_unknown_versions_are_dropped():
    rows = [
        {"policy_version": "v0", "trajectory_id": "old"},
        {"group_id": "", "policy_version": "v3", "trajectory_id": "new"},
        {"group_id": "g", "behaviour_version": None, "trajectory_id": "base"},  # None = base = 0
        {"group_id": "h", "policy_version": "nightly", "trajectory_id": "odd"},
        {"group_id": "i", "policy_version": "v3", "trajectory_id": "i-v3"},
        {"group_id": "i", "policy_version": "nightly", "trajectory_id": "i-odd"},  # drops i whole
    ]
    out = admit_groups(rows, "v3", max_staleness=2)
    assert [r["trajectory_id"] for r in out.rows] == ["new"]
    assert out.dropped_groups == 4 and out.unknown_versions == ["nightly"]
    assert out.staleness_histogram == {"0": 1}
    base = admit_groups(rows, None, max_staleness=0)  # no numbered version is stale for base weights
    assert [r["trajectory_id"] for r in base.rows] == ["old", "new", "base"]
    assert base.dropped_groups == 2 and base.unknown_versions == ["nightly"]
    assert admit_groups(rows, "v3", max_staleness=100).dropped_groups == 2  # no bound measures them


def test_truncated_importance_weights_golden():
    assert truncated_weight(-1.0, -1.0, 2.0) == 1.0
    assert truncated_weight(-1.0, -1.5, 2.0) == pytest.approx(math.exp(0.5))  # 1.6487: kept
    assert truncated_weight(-1.0, -3.0, 2.0) == 2.0  # exp(2) = 7.39, truncated
    assert truncated_weight(-2.0, -1.0, 2.0) == pytest.approx(math.exp(-1.0))  # below 1: never raised
    assert truncated_weight(-1.0, None, 2.0) == 1.0  # no behaviour logprob: no correction


def test_tensor_weights_match_the_plain_golden_values():
    import torch

    old = torch.tensor([[-1.0, -1.0, -2.0, -1.0, -0.3]])
    behaviour = torch.tensor([[-1.5, -3.0, -1.0, 0.0, -9.0]])
    has = torch.tensor([[True, True, True, False, False]])
    weight, ratio = tis_weights(old, behaviour, has, 2.0)
    cells = zip(old[0].tolist(), behaviour[0].tolist(), has[0].tolist(), strict=True)
    plain = [truncated_weight(o, b if h else None, 2.0) for o, b, h in cells]
    assert weight[0].tolist() == pytest.approx(plain)
    assert ratio[0, :3].tolist() == pytest.approx([math.exp(0.5), math.exp(2.0), math.exp(-1.0)])
    none, _ = tis_weights(old, behaviour, has, None)
    assert none.tolist() == [[1.0] * 5]
    figures = importance_metrics([importance_sums(ratio, weight, has, 2.0)])
    assert figures["is_ratio_max"] == pytest.approx(math.exp(2.0))
    assert figures["is_ratio_mean"] == pytest.approx((math.exp(0.5) + math.exp(2.0) + math.exp(-1.0)) / 3)
    assert figures["is_truncated_fraction"] == pytest.approx(1 / 3)
    assert figures["ess"] == pytest.approx(effective_sample_size(plain[:3]))


def test_effective_sample_size_golden():
    assert effective_sample_size([1.0, 1.0, 1.0, 1.0]) == 1.0
    assert effective_sample_size([2.0, 1.0]) == pytest.approx(9 / 10)
    assert effective_sample_size([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert effective_sample_size([]) == 1.0
    empty = importance_metrics([])
    assert empty == {"is_ratio_mean": 1.0, "is_ratio_max": 1.0, "ess": 1.0, "is_truncated_fraction": 0.0}


def test_learning_rate_warms_up_then_follows_a_cosine_to_the_floor():
    lr = [learning_rate_at(s, 1e-3, 4, "cosine", 10, 0.1) for s in range(20)]
    assert lr[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lr[4] == pytest.approx(1e-3)
    assert lr[9] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half-way through the period
    assert lr[14:] == pytest.approx([1e-4] * 6)  # after the period: the floor
    assert all(a >= b for a, b in itertools.pairwise(lr[4:]))
    assert learning_rate_at(7, 1e-3, 0, "constant", 10, 0.1) == 1e-3


def _grad(advantage: float, weight: float = 1.0, ref: float | None = None, kl_beta: float = 0.0):
    import torch

    logps = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]])
    adv = torch.full((1, 2), advantage)
    mask = torch.tensor([[True, True]])
    ref_t = None if ref is None else torch.full((1, 2), ref)
    loss, stats = grpo_loss(logps, old, adv, mask, 0.2, ref_t, kl_beta, torch.full((1, 2), weight))
    loss.backward()
    return float(logps.grad[0, 0]), stats


def test_grpo_gradient_follows_the_sign_of_the_advantage_scaled_by_the_weight():
    up, _ = _grad(+1.0)
    down, _ = _grad(-1.0)
    assert up < 0 < down  # descent raises logp where A > 0 and lowers it where A < 0
    assert _grad(+1.0, weight=2.0)[0] == pytest.approx(2 * up)  # the TIS weight scales the step
    assert _grad(0.0)[0] == 0.0


def test_kl_term_pulls_the_logprob_toward_the_reference():
    above, stats = _grad(0.0, ref=-2.0, kl_beta=1.0)  # policy more likely than the reference
    below, _ = _grad(0.0, ref=-0.5, kl_beta=1.0)
    assert above > 0 > below  # descent lowers logp toward -2 and raises it toward -0.5
    assert float(stats["kl"][0, 0]) == pytest.approx(math.exp(-1.0) + 1.0 - 1.0)
    assert _grad(0.0, ref=-1.0, kl_beta=1.0)[0] == 0.0  # at the reference: no pull


def test_clipped_fraction_counts_tokens_where_the_clip_is_active():
    import torch

    logps = torch.tensor([[-0.5, -1.0, -1.5]])  # rho = e^0.5 (clipped for A > 0), 1, e^-0.5
    old = torch.full((1, 3), -1.0)
    _, stats = grpo_loss(logps, old, torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool), 0.2)
    assert stats["clipped"].tolist() == [[1.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("is_truncation", 0.5),
        ("max_staleness", -1),
        ("warmup_steps", -1),
        ("min_lr_ratio", 1.5),
        ("kl_beta", -0.1),
    ],
)
def test_config_errors_name_the_option_and_the_value(option, value):
    with pytest.raises(ConsumerConfigError) as err:
        TrainConfig(**{option: value})
    assert f"--{option.replace('_', '-')}" in str(err.value) and repr(value) in str(err.value)


def test_correction_is_on_by_default():
    config = TrainConfig()
    assert (config.is_correction, config.is_truncation, config.max_staleness) == ("tis", 2.0, 2)
    assert config.kl_beta == 0.0 and config.reference == "base" and config.lr_schedule == "cosine"


def test_docstring_examples_hold():
    import doctest

    from consumers.training import offpolicy

    result = doctest.testmod(offpolicy)
    assert result.attempted >= 9 and result.failed == 0
