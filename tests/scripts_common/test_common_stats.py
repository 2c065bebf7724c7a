"""The held-out figures' noise: a mean's standard error, and a paired change's."""

import math

import pytest
from common import stats
from hypothesis import given
from hypothesis import strategies as st

scores = st.lists(st.floats(0, 1, allow_nan=False), min_size=2, max_size=40)


def test_mean_and_standard_error_by_hand():
    # values 0, 0, 1, 1: mean 0.5, sample variance 1/3, standard error sqrt(1/3 / 4)
    assert stats.mean_and_standard_error([0, 0, 1, 1]) == (0.5, pytest.approx(math.sqrt(1 / 12)))
    assert stats.mean_and_standard_error([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError, match="at least one value"):
        stats.mean_and_standard_error([])


@given(scores, st.floats(-0.5, 0.5, allow_nan=False))
def test_a_change_the_same_on_every_problem_is_known_exactly(before, shift):
    """Pairing removes each problem's difficulty: a uniform shift has no noise at all, however spread the
    problems are, where the two figures' own errors would say otherwise."""
    change, error = stats.paired_change(before, [b + shift for b in before])
    assert change == pytest.approx(shift, abs=1e-9) and error == pytest.approx(0.0, abs=1e-9)


@given(scores, scores)
def test_the_paired_change_is_the_difference_of_the_means(before, after):
    after = (after * len(before))[: len(before)]
    change, error = stats.paired_change(before, after)
    assert change == pytest.approx(stats.mean_and_standard_error(after)[0] - stats.mean_and_standard_error(before)[0])
    assert error >= 0


def test_a_paired_change_needs_the_same_problems():
    with pytest.raises(ValueError, match="same items before and after, got 2 and 3"):
        stats.paired_change([0, 1], [0, 1, 1])
