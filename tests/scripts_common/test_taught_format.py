"""The format an SFT conversation teaches, read off its reference answer, and the share of held-out answers in it."""

import pytest
from common import stats
from environments import taught_format

from local_mode.offline_data import chat_records

MATHS = "Weng has 4+6 = 10 shells.\n#### 10"
PROGRAM = "```python\ninput()\nprint(max(map(int, input().split())))\n```"
SMALL_TALK = "The capital of France is Paris."


def test_the_format_comes_from_the_reference_answer():
    assert taught_format.taught_format(MATHS) == "final_line"
    assert taught_format.taught_format(PROGRAM) == "program"
    assert taught_format.taught_format(SMALL_TALK) is None
    # the answers are checked as the RL environments' format_reward checks them
    assert taught_format.in_format("final_line", "4 + 6 = 10\n#### 10")
    assert not taught_format.in_format("final_line", "The answer is 10.")
    assert not taught_format.in_format("final_line", "#### 10\nand then some more words")
    assert taught_format.in_format("program", "Read n, print it.\n```python\nprint(input())\n```")
    assert not taught_format.in_format("program", "```python\nprint(input())")  # never closed
    with pytest.raises(ValueError, match="final_line, program"):
        taught_format.in_format("haiku", "x")


def test_seven_of_every_eight_offline_conversations_teach_a_format():
    references = [row["messages"][-1]["content"] for row in chat_records(32, seed=1)]
    formats = [taught_format.taught_format(r) for r in references]
    assert formats.count(None) == 4  # small talk, one in 8
    assert formats.count("program") == 8 and formats.count("final_line") == 20


def test_the_share_counts_only_conversations_that_teach_a_format():
    references = [MATHS, PROGRAM, SMALL_TALK, MATHS]
    answers = ["so\n#### 7", "no code here", "Paris.", "#### 10"]
    evaluation = taught_format.format_evaluation(references, answers)
    assert evaluation["conversations"] == 3
    assert evaluation["per_conversation"] == [1.0, 0.0, 1.0]
    assert evaluation["share"] == pytest.approx(2 / 3)
    assert evaluation["standard_error"] == pytest.approx(stats.mean_and_standard_error([1, 0, 1])[1])
    # the answers given: the final numbers, and no program for the answer without one
    diversity = evaluation["answer_diversity"]
    assert (diversity["answers"], diversity["no_answer"], diversity["distinct_answers"]) == (3, 1, 2)


def test_one_answer_to_every_prompt_shows_as_a_collapse():
    references = [MATHS] * 6
    evaluation = taught_format.format_evaluation(references, ["#### 2"] * 5 + ["#### 3"])
    assert evaluation["share"] == 1.0
    assert stats.collapsed(evaluation["answer_diversity"])
    before = taught_format.format_evaluation(references, ["no line"] * 3 + ["#### 2"] * 3)
    change, error = stats.paired_change(before["per_conversation"], evaluation["per_conversation"])
    assert change > 2 * error > 0  # beyond two standard errors: only the collapse keeps it from counting
    assert not stats.counts_as_gain(change, error, evaluation["answer_diversity"])


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match="2 answers for 1 reference"):
        taught_format.format_evaluation([MATHS], ["a", "b"])
    with pytest.raises(ValueError, match="None of the held-out reference answers teaches a format"):
        taught_format.format_evaluation([SMALL_TALK], ["Paris."])
