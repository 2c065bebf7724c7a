"""The GSM8K checker on completions as models write them, traps included."""

import json

import pytest
from common.contract import UserError
from environments import make_environment
from environments.gsm8k import GSM8KEnvironment, extract_answer, has_final_line, is_correct, parse_number

# (completion, reference, expected correct)
CASES = [
    ("Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips altogether.\n#### 72", "72", True),
    ("48 + 24 = 72\n#### 72.0", "72", True),
    ("The total is 1,000 dollars.\n#### 1,000", "1000", True),
    ("So she needs $5.00 more.\n#### $5.00", "5", True),
    ("The temperature dropped to -3 degrees.\n#### -3", "-3", True),
    ("The temperature dropped by 3 degrees.\n#### 3", "-3", False),
    ("Each friend gets 3/4 of a pizza.\n#### 3/4", "0.75", True),
    ("Each friend gets 0.75 of a pizza.\n#### 0.75", "3/4", True),
    ("The answer is \\boxed{12}.", "12", True),
    ("The answer is \\boxed{\\frac{3}{4}}", "0.75", True),
    ("Answer: \\boxed{12 apples}", "12", True),
    # '####' wins over a later stray number, \boxed wins over the last number.
    ("#### 18\nI hope that helps with all 3 questions!", "18", True),
    ("So \\boxed{7}. Checking: 3 + 4 = 7, and 2 more gives 9", "7", True),
    # without a marker, the last number counts, not the first
    ("First 16 - 3 - 4 = 9 eggs, then 9 * 2 = 18 dollars", "18", True),
    ("First 16 - 3 - 4 = 9 eggs, then 9 * 2 = 18 dollars", "9", False),
    ("I don't know.", "5", False),
    ("", "5", False),
    ("#### seventy-two", "72", False),
    ("He paid $1,234.50 in total.\n#### 1234.5", "1234.5", True),
    ("It takes 2-3 hours, so about 3.\n#### 3", "3", True),
    ("The result is 72.", "72", True),
    ("The result is 720", "72", False),
    ("Result: 5 - 8 = -3\n#### -3", "-3", True),
    ("#### 7.", "7", True),
]


@pytest.mark.parametrize("completion,reference,expected", CASES)
def test_checker_table(completion, reference, expected):
    assert is_correct(completion, reference) is expected, extract_answer(completion)


def test_extraction_and_parsing_details():
    assert extract_answer("no number here") is None
    assert extract_answer("#### 1,000") == "1,000"
    assert extract_answer("She has 10 - 3 left") == "3"  # a minus between numbers is not a sign
    assert extract_answer("It costs $ 12") == "$ 12"
    assert extract_answer("It went from 5 to -8") == "-8"
    assert parse_number("1,000") == 1000
    assert parse_number("$5.00") == 5
    assert parse_number("72.0") == 72
    assert parse_number("-3") == -3
    assert parse_number("3/4") == parse_number("0.75")
    assert parse_number("1/0") is None
    assert parse_number("abc") is None


def test_format_reward():
    assert has_final_line("step one\n#### 42")
    assert has_final_line("step one\n#### $1,000  \n")
    assert not has_final_line("#### 42 and then more text")
    assert not has_final_line("The answer is 42")
    assert not has_final_line("\\boxed{42}")


def test_score_and_prompt():
    env = make_environment("gsm8k")
    assert isinstance(env, GSM8KEnvironment)
    example = {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
    messages = env.prompt_messages(example)
    assert messages[0]["role"] == "system" and "####" in messages[0]["content"]
    assert messages[-1] == {"role": "user", "content": "What is 2 + 3?"}
    scores = env.score([example] * 3, ["#### 5", "the answer is 5", "#### 6"])
    assert [s["reward"] for s in scores] == [1.0, 1.0, 0.0]
    assert [s["correct"] for s in scores] == [True, True, False]
    assert [s["format_reward"] for s in scores] == [1.0, 0.0, 1.0]
    assert scores[0]["reference"] == "5" and scores[2]["extracted"] == "6"


def test_unknown_environment_is_named():
    with pytest.raises(UserError, match="gsm8k"):
        make_environment("chess")


def test_load_reads_project_data(offline_data):
    rows = GSM8KEnvironment().load(offline_data["gsm8k"] / "train.jsonl")
    assert len(rows) == 32 and all("####" in row["answer"] for row in rows)


@pytest.mark.parametrize(
    "row,message",
    [
        ({"answer": "#### 3"}, "field 'question' is missing"),
        ({"question": "q"}, "field 'answer' is missing"),
        ({"question": "q", "answer": "  "}, "field 'answer' is empty"),
        ({"question": "q", "answer": "it is 3"}, "no '#### <number>'"),
        ({"question": "q", "answer": "#### three"}, "is not a number"),
        (["q", "a"], "expected a JSON object"),
    ],
)
def test_load_errors_name_file_line_and_field(tmp_path, row, message):
    path = tmp_path / "train.jsonl"
    good = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(row) + "\n")
    with pytest.raises(UserError, match=message) as error:
        GSM8KEnvironment().load(path)
    assert f"{path}, line 3" in str(error.value)


def test_load_rejects_broken_json_and_empty_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"question": \n')
    with pytest.raises(UserError, match="line 2: not valid JSON"):
        GSM8KEnvironment().load(path)
    path.write_text("\n")
    with pytest.raises(UserError, match="has no rows"):
        GSM8KEnvironment().load(path)
