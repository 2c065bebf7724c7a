"""A held-out figure that rose because most answers became one answer is a collapse, not learning: the
answers each model gave, counted (``common.stats.answer_diversity``), and the rule that refuses to call
such a change a gain (``collapsed``, ``counts_as_gain``, ``judge_change``)."""

from __future__ import annotations

import pytest
from common import stats
from environments.code import CodeEnvironment
from environments.gsm8k import GSM8KEnvironment


def test_answers_are_counted_with_the_most_common_ones_share_of_all_evaluated():
    diversity = stats.answer_diversity(["2", "3", "2", None, "5", None])
    assert diversity == {
        "answers": 6,
        "no_answer": 2,
        "distinct_answers": 3,
        "most_common_answer": "2",
        "most_common_count": 2,
        "most_common_share": pytest.approx(2 / 6),
    }
    assert not stats.collapsed(diversity)
    assert (
        stats.describe_answers(diversity) == "6 answers, 3 distinct; the most common, '2', 2 of 6; 2 without an answer"
    )
    # no answer at all is not one answer: nothing given, nothing collapsed into
    silent = stats.answer_diversity([None] * 4)
    assert (silent["distinct_answers"], silent["most_common_answer"], silent["most_common_share"]) == (0, None, 0.0)
    assert not stats.collapsed(silent)
    assert stats.describe_answers(silent) == "none of the 4 completions gave an answer"
    with pytest.raises(ValueError, match="at least one answer"):
        stats.answer_diversity([])


def test_more_than_half_the_answers_being_one_is_a_collapse_and_half_is_not():
    assert stats.COLLAPSE_SHARE == 0.5
    assert not stats.collapsed(stats.answer_diversity(["2", "2", "3", "4"]))  # half
    one = stats.answer_diversity(["2", "2", "2", "4"])
    assert stats.collapsed(one)
    assert stats.describe_answers(one) == "collapsed: 3 of 4 answers are '2'"


def test_a_gsm8k_answer_is_the_number_the_checker_read():
    env = GSM8KEnvironment()
    problems = [{"question": "q", "answer": "so #### 2"}] * 3
    scores = env.score(problems, ["It is 2.\n#### 2", " 2.\n#### 2 ", "I do not know."])
    completions = ["It is 2.\n#### 2", " 2.\n#### 2 ", "I do not know."]
    answers = [stats.given_answer(c, s) for c, s in zip(completions, scores, strict=True)]
    assert answers == ["2", "2", None]


def test_a_code_answer_is_its_program_whatever_prose_surrounds_it():
    def judge(items, reward_mode):
        return [{"verdict": "wrong_answer", "reward": 0.0, "passed": 0, "total": 1} for _ in items]

    env = CodeEnvironment(judge=judge)
    problem = {"id": "p", "statement": "s", "testtype": "stdin", "tests": [{"input": "1\n", "output": "1\n"}]}
    completions = [
        "Here is my answer:\n```python\nprint(input())\n```\n",
        "Sure.\n```python\nprint(input())   \n\n```\nDone.",  # trailing spaces and a blank line: the same program
        "```python\nprint(2)\n```\n",
        "no program at all",
    ]
    scores = env.score([problem] * len(completions), completions)
    answers = [stats.given_answer(c, s) for c, s in zip(completions, scores, strict=True)]
    assert answers == ["print(input())", "print(input())", "print(2)", None]
    assert stats.answer_diversity(answers)["distinct_answers"] == 2


# The case: 32 held-out problems; the trained model answers '2' to all of them and 6 references are 2.
COLLAPSED = stats.answer_diversity(["2"] * 32)
DIVERSE = stats.answer_diversity([str(n) for n in range(32)])


def test_a_collapsed_models_rise_beyond_two_standard_errors_is_refused_and_a_diverse_ones_is_a_gain():
    change, error = stats.paired_change([0.0] * 32, [1.0] * 6 + [0.0] * 26)
    assert change / error > stats.GAIN_STANDARD_ERRORS  # by its size alone it would count
    assert not stats.counts_as_gain(change, error, COLLAPSED)
    assert stats.judge_change(change, error, COLLAPSED) == (
        "+2.7 standard errors; collapsed: 32 of 32 answers are '2', not counted as a gain"
    )
    assert stats.counts_as_gain(change, error, DIVERSE)
    assert stats.judge_change(change, error, DIVERSE) == "+2.7 standard errors: a gain"


@pytest.mark.parametrize(
    "change, error, after, verdict",
    [
        (0.05, 0.04, DIVERSE, "+1.2 standard errors: within 2 standard errors, not a gain"),
        (-0.2, 0.05, DIVERSE, "-4.0 standard errors: a loss"),
        (0.2, 0.0, DIVERSE, "no spread to measure it against: not a gain"),
        (
            0.2,
            0.05,
            None,
            "+4.0 standard errors; the evaluation did not count its answers (an older one), not counted as a gain",
        ),  # fmt: skip
    ],
)
def test_a_change_is_a_gain_only_beyond_two_measured_standard_errors_with_the_answers_counted(
    change, error, after, verdict
):
    assert not stats.counts_as_gain(change, error, after)
    assert stats.judge_change(change, error, after) == verdict
