"""The claims' inference: one unit one vote, Holm against a hand computation, intervals that
resample units, p-values of exact and Monte Carlo nulls, the smallest detectable effect."""
import numpy as np
import pandas as pd
import pytest

from oattn_lib import inference as inf


def test_holm_against_a_hand_computation():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (monotone)
    got = inf.holm([0.01, 0.04, 0.03, np.nan, 0.005])
    assert got[:3].tolist() == pytest.approx([0.03, 0.06, 0.06])
    assert np.isnan(got[3]) and got[4] == pytest.approx(0.02)
    assert inf.holm_multipliers([0.01, 0.04, 0.03, np.nan, 0.005]).tolist()[:3] == [3, 1, 2]
    assert inf.holm([0.5, 0.9]).tolist() == [1.0, 1.0]          # capped at 1
    assert np.isnan(inf.holm([np.nan])).all()


def test_holm_controls_the_familywise_error_where_raw_p_values_do_not():
    rng = np.random.default_rng(0)
    p = rng.random((2000, 50))                                  # 50 true nulls, 2000 tables
    raw = (p < 0.05).any(1).mean()
    holm = (np.apply_along_axis(inf.holm, 1, p) < 0.05).any(1).mean()
    assert raw > 0.9 and holm <= 0.06


def test_one_head_measured_on_48_samples_is_one_vote_and_cannot_reach_significance():
    frame = pd.DataFrame({"layer": 0, "head": 0, "v": np.linspace(0.5, 1.0, 48)})
    per_head = inf.unit_values(frame, ["layer", "head"], "v")
    assert per_head.size == 1
    t = inf.one_sample_test(per_head.to_numpy(), 0.0, "head", 500, 0)
    assert t.n_units == 1 and not t.p < 0.05
    # the same 48 values as 48 heads decide
    t48 = inf.one_sample_test(frame["v"].to_numpy(), 0.0, "head", 500, 0)
    assert t48.p < 1e-10


def test_unit_values_average_each_units_rows_and_clip_infinities():
    frame = pd.DataFrame({"layer": [0, 0, 1, 1, 2], "head": [0, 0, 1, 1, 0],
                          "v": [1.0, 3.0, np.inf, 1.0, np.nan]})
    got = inf.unit_values(frame, ["layer", "head"], "v")
    assert got.loc[(0, 0)] == 2.0 and got.loc[(1, 1)] == pytest.approx((inf.CLIP + 1) / 2)
    assert (2, 0) not in got.index                               # a unit with no finite value is left out


def test_the_bootstrap_resamples_units_so_few_units_give_a_wide_interval():
    rng = np.random.default_rng(1)
    heads = rng.normal(1.0, 1.0, 4)
    lo, hi, se = inf.bootstrap_interval(heads, 4000, 0)
    assert lo <= heads.mean() <= hi and se > 0
    many = rng.normal(1.0, 1.0, 400)
    lo2, hi2, _ = inf.bootstrap_interval(many, 4000, 0)
    assert (hi2 - lo2) < (hi - lo) / 4
    assert np.isnan(inf.bootstrap_interval([1.0], 100, 0)[0])


def test_one_sample_test_is_one_sided_against_its_margin():
    x = np.full(20, 0.1) + np.linspace(-0.01, 0.01, 20)
    assert inf.one_sample_test(x, 0.0, "s", 200, 0).p < 1e-6
    assert inf.one_sample_test(x, 0.2, "s", 200, 0).p > 0.99      # clearly below the margin
    assert inf.one_sample_test(-x, 0.0, "s", 200, 0).p > 0.99


def test_two_sample_test_follows_the_groups_order():
    a, b = np.linspace(1.0, 1.2, 6), np.linspace(0.0, 0.2, 6)
    t = inf.two_sample_test(a, b, 0.0, "sample", 500, 0)
    assert t.effect == pytest.approx(1.0) and t.p < 1e-6 and t.ci_low > 0.8
    assert inf.two_sample_test(b, a, 0.0, "sample", 500, 0).p > 0.999


def test_exact_p_counts_the_observed_outcome_among_all_and_monte_carlo_never_reaches_zero():
    null = np.arange(10.0)                                       # every outcome once
    assert inf.permutation_p(9.0, null, exact=True) == 0.1
    assert inf.permutation_p(0.0, null, exact=True) == 1.0
    assert inf.permutation_p(100.0, null) == pytest.approx(1 / 11)
    t = inf.exact_or_mc_test(9.0, null, 0.0, "set", True, 100, 0)
    assert t.effect == 4.5 and t.ci_low == t.ci_high == 4.5 and t.p == 0.1 and t.p_min == 0.1


def test_the_smallest_detectable_effect_grows_with_the_table_and_is_infinite_where_no_p_can_reach():
    t = inf.one_sample_test(np.random.default_rng(0).normal(0.3, 0.1, 16), 0.0, "head", 500, 0)
    one, many = inf.with_mde(t, 1).mde, inf.with_mde(t, 100).mde
    assert 0 < one < many < 1
    # the sd / sqrt(n) scale: (t_.95 + t_.80) se at m = 1
    from scipy.stats import t as student
    assert one == pytest.approx((student.ppf(0.95, 15) + student.ppf(0.8, 15)) * t.se)
    few = inf.exact_or_mc_test(1.0, np.zeros(4), 0.0, "order", False, 100, 0)   # p >= 1/5
    assert inf.with_mde(few, 1).mde == np.inf
    assert np.isinf(inf.with_mde(inf.one_sample_test([1.0], 0.0, "head", 10, 0), 1).mde)
