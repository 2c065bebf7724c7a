"""The code environment: public data layouts, program extraction, judging and rewards."""

import base64
import json
import os
import pickle
import zlib

import pytest
from common.contract import UserError
from environments.code import CodeEnvironment, extract_program, local_judge, normalize_problem, verdict_stats

from local_mode.offline_data import code_problem_records, write_jsonl

# --------------------------------------------------------------------------- layouts

CODE_CONTESTS = {
    "name": "1548_A. Sum",
    "description": "Print a + b.",
    "public_tests": {"input": ["1 2\n"], "output": ["3\n"]},
    "private_tests": {"input": ["5 5\n"], "output": ["10\n"]},
    "generated_tests": {"input": ["0 0\n", "-1 1\n"], "output": ["0\n", "0\n"]},
    "difficulty": 7,
    "solutions": {"language": [3], "solution": ["print(sum(map(int, input().split())))"]},
}
APPS_STDIN = {
    "problem_id": 12,
    "question": "Print a + b.",
    "starter_code": "",
    "input_output": json.dumps({"inputs": ["1 2\n", ["3 4"]], "outputs": ["3\n", ["7"]]}),
}
APPS_CALL = {
    "problem_id": 13,
    "question": "Return the sum of a list.",
    "starter_code": "def total(xs):\n",
    "input_output": json.dumps({"fn_name": "total", "inputs": [[[1, 2, 3]], [[]]], "outputs": [[6], [0]]}),
}


def livecodebench_row(private_cases, functional=False):
    if functional:
        public = [{"input": "[1, 2]\n3", "output": "6", "testtype": "functional"}]
    else:
        public = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    return {
        "question_id": "abc123_a",
        "question_title": "Sum",
        "question_content": "Add them.",
        "platform": "atcoder",
        "starter_code": "",
        "public_test_cases": json.dumps(public),
        "private_test_cases": private_cases,
        "metadata": json.dumps({"func_name": "add"} if functional else {}),
    }


def test_code_contests_layout_keeps_every_split():
    problem = normalize_problem(CODE_CONTESTS)
    assert problem["id"] == "1548_A. Sum" and problem["testtype"] == "stdin"
    assert [t["output"] for t in problem["tests"]] == ["3\n", "10\n", "0\n", "0\n"]


def test_apps_layouts_stdin_and_call_based():
    stdin = normalize_problem(APPS_STDIN)
    assert stdin["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "3 4\n", "output": "7\n"}]
    call = normalize_problem(APPS_CALL)
    assert call["testtype"] == "functional" and call["fn_name"] == "total"
    # APPS wraps each return value in a one-element list; the argument list is kept as it is.
    assert call["tests"] == [{"input": "[[1, 2, 3]]", "output": "6"}, {"input": "[[]]", "output": "0"}]


def test_livecodebench_json_and_compressed_private_tests():
    private = [{"input": "5 5\n", "output": "10\n", "testtype": "stdin"}]
    plain = normalize_problem(livecodebench_row(json.dumps(private)))
    # The layout LiveCodeBench ships: base64(zlib(pickle(json text))); read without unpickling.
    packed = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private)))).decode()
    compressed = normalize_problem(livecodebench_row(packed))
    assert (
        plain["tests"]
        == compressed["tests"]
        == [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]
    )
    functional = normalize_problem(livecodebench_row("[]", functional=True))
    assert functional["fn_name"] == "add" and functional["tests"] == [{"input": "[[1, 2], 3]", "output": "6"}]


class _RunsCommand:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_pickle_that_runs_code_is_refused_not_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    packed = base64.b64encode(zlib.compress(pickle.dumps(_RunsCommand(marker)))).decode()
    with pytest.raises(ValueError, match="refusing to unpickle"):
        normalize_problem(livecodebench_row(packed))
    assert not marker.exists()


def test_load_names_the_file_line_and_problem(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [CODE_CONTESTS, APPS_CALL, {"statement": "x", "tests": []}])
    with pytest.raises(UserError, match=r"train.jsonl, line 3: field 'tests' must be a non-empty list"):
        CodeEnvironment().load(path)
    path = write_jsonl(tmp_path / "odd.jsonl", [{"prompt": "hello"}])
    with pytest.raises(UserError, match=r"line 1: unknown problem layout"):
        CodeEnvironment().load(path)


def test_load_reads_the_project_data_and_caps_tests(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", code_problem_records(10) + [CODE_CONTESTS])
    problems = CodeEnvironment(max_tests=2).load(path)
    assert len(problems) == 11 and all(len(p["tests"]) == 2 for p in problems)
    assert {p["testtype"] for p in problems} == {"stdin", "functional"}
    messages = CodeEnvironment().prompt_messages(problems[4])
    assert "solve" in messages[-1]["content"] and "```python" in messages[0]["content"]


# --------------------------------------------------------------------------- programs and rewards


def test_the_program_is_the_last_fenced_block():
    text = "First try:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```\nDone."
    assert extract_program(text) == "print(2)\n"
    assert extract_program("no code here") is None
    assert extract_program("```python\nprint(3)\n") is None  # cut off before the closing fence
    assert extract_program("```\nx = 1\n```") == "x = 1\n"


SUM_PROBLEM = {
    "id": "sum",
    "statement": "a+b",
    "testtype": "stdin",
    "float_tolerance": False,
    "tests": [
        {"input": "1 2\n", "output": "3\n"},
        {"input": "5 -5\n", "output": "0\n"},
        {"input": "7 1\n", "output": "8\n"},
    ],
}
FUNCTION_PROBLEM = normalize_problem(code_problem_records(5)[4])  # solve(a, b) = a * b + a


def fenced(program):
    return f"Here it is:\n```python\n{program}```\n"


def test_score_verdicts_and_fraction_rewards(code_sandbox):
    env = CodeEnvironment(local_judge(code_sandbox), "fraction")
    completions = [
        fenced("a, b = map(int, input().split())\nprint(a + b)\n"),
        fenced("a, b = map(int, input().split())\nprint(a + b if a != 5 else 1)\n"),  # 2 of 3
        "I would add the numbers.",
        fenced("while True:\n    pass\n"),
        fenced("class Solution:\n    def solve(self, a, b):\n        return a * b + a\n"),
        fenced("def solve(a, b):\n    return a * b\n"),
    ]
    examples = [SUM_PROBLEM] * 4 + [FUNCTION_PROBLEM] * 2
    scores = env.score(examples, completions)
    assert [s["verdict"] for s in scores] == [
        "accepted",
        "wrong_answer",
        "no_code",
        "time_limit",
        "accepted",
        "wrong_answer",
    ]
    assert [s["reward"] for s in scores[:4]] == [1.0, pytest.approx(2 / 3), 0.0, 0.0]
    assert scores[0]["correct"] and not scores[1]["correct"]
    assert [s["format_reward"] for s in scores[:3]] == [1.0, 1.0, 0.0]
    stats = env.step_metrics()
    assert stats["accepted_rate"] == pytest.approx(2 / 6) and stats["no_code_rate"] == pytest.approx(1 / 6)
    assert stats["time_limit_rate"] == pytest.approx(1 / 6) and stats["judge_time"] > 0
    # Each call covers the completions scored since the previous one: a second step starts afresh.
    env.score([SUM_PROBLEM], [fenced("print(sum(map(int, input().split())))\n")])
    assert env.step_metrics()["accepted_rate"] == 1.0


def test_all_or_nothing_stops_at_the_first_failure(code_sandbox):
    program = "a, b = map(int, input().split())\nprint(a + b if a != 1 else 0)\n"  # fails the first test
    judgement = code_sandbox.judge(SUM_PROBLEM, program, reward_mode="all_or_nothing")
    assert judgement.reward == 0.0 and judgement.verdict == "wrong_answer"
    assert len(judgement.outcomes) == 1 and judgement.total == 3
    fraction = code_sandbox.judge(SUM_PROBLEM, program, reward_mode="fraction")
    assert fraction.reward == pytest.approx(2 / 3) and len(fraction.outcomes) == 3
    good = code_sandbox.judge(SUM_PROBLEM, "print(sum(map(int, input().split())))\n", reward_mode="all_or_nothing")
    assert good.reward == 1.0 and good.verdict == "accepted"


def test_float_problems_accept_small_errors_only(code_sandbox):
    problem = {"testtype": "stdin", "float_tolerance": True, "tests": [{"input": "", "output": "0.333333\n"}]}
    assert code_sandbox.judge(problem, "print(1/3)\n").verdict == "accepted"
    assert code_sandbox.judge(problem, "print(0.3333)\n").verdict == "wrong_answer"
    problem["float_tolerance"] = False
    assert code_sandbox.judge(problem, "print(1/3)\n").verdict == "wrong_answer"


def test_verdict_stats_cover_every_verdict():
    stats = verdict_stats(
        [{"verdict": "accepted", "passed": 2, "total": 2}, {"verdict": "runtime_error", "passed": 0, "total": 2}],
        judge_time=0.5,
    )
    assert stats["accepted_rate"] == 0.5 and stats["runtime_error_rate"] == 0.5 and stats["test_pass_fraction"] == 0.5
    assert {
        "wrong_answer_rate",
        "time_limit_rate",
        "memory_limit_rate",
        "output_limit_rate",
        "sandbox_violation_rate",
        "no_code_rate",
        "judge_time",
    } <= set(stats)


# --------------------------------------------------------------------------- functions to complete (HumanEval's form)


def test_function_problems_are_completed_by_their_canonical_body_and_judged_by_calls(code_sandbox):
    """Each of the twenty kinds: the signature and docstring plus the canonical body pass all five calls
    in the sandbox; the signature with a wrong body passes none of a kind's problems entirely; the
    docstring's example is the first test."""
    from local_mode.offline_data import function_problem_records

    records = function_problem_records(40, seed=3)
    assert len({r["fn_name"] for r in records}) == 20
    env = CodeEnvironment(local_judge(code_sandbox), "fraction")
    problems = [normalize_problem(r) for r in records]
    right = [fenced(r["starter_code"] + r["canonical_solution"]) for r in records]
    wrong = [fenced(r["starter_code"] + "    return None\n") for r in records]
    scores = env.score(problems + problems, right + wrong)
    assert [s["verdict"] for s in scores[:40]] == ["accepted"] * 40, list(zip(records, scores[:40], strict=True))
    assert not any(s["correct"] for s in scores[40:])
    for record in records:
        example = json.loads(record["tests"][0]["input"])
        assert f">>> {record['fn_name']}({', '.join(repr(a) for a in example)})" in record["starter_code"]
        assert all(len(t["input"]) < 200 for t in record["tests"])


def test_held_out_function_problems_are_other_draws():
    """The session notebook trains on seed s and holds out seed 10,000 + s: no held-out problem (its
    statement and tests) is a training problem, and every kind is held out."""
    from local_mode.offline_data import function_problem_records

    def key(r):
        return r["statement"], json.dumps(r["tests"])

    training = {key(r) for r in function_problem_records(256, seed=0)}
    held_out = function_problem_records(40, seed=10_000)
    assert not any(key(r) in training for r in held_out)
    assert len({r["fn_name"] for r in held_out}) == 20


# MBPP's layout (google-research-datasets/mbpp): the cloud source of the functions data set.
MBPP_ROWS = [
    {
        "task_id": 11,
        "text": "Write a python function to remove first and last occurrence of a given character from the string.",
        "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): \r\n"
        "            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in range(len(s) - 1,-1,-1):  \r\n"
        "        if (s[i] == ch): \r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    return s ",
        "test_list": [
            'assert remove_Occ("hello","l") == "heo"',
            'assert remove_Occ("abcda","a") == "bcd"',
            'assert remove_Occ("PHP","P") == "H"',
        ],
        "test_setup_code": "",
    },
    {
        "task_id": 17,
        "text": "Write a function to find the perimeter of a square.",
        "code": "def square_perimeter(a):\r\n  perimeter=4*a\r\n  return perimeter",
        "test_list": ["assert square_perimeter(10)==40", "assert square_perimeter(5)==20"],
        "test_setup_code": "",
    },
    {  # tuples travel as JSON lists, and the function's tuple comes back as one
        "task_id": 2,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(a, b):\n  return tuple(sorted(set(a) & set(b)))",
        "test_list": ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)"],
        "test_setup_code": "",
    },
]
MBPP_UNUSABLE = [
    {**MBPP_ROWS[2], "test_list": ["assert set(similar_elements((3, 4),(4, 5))) == set((4,))"]},  # not a call
    {**MBPP_ROWS[1], "test_list": ["assert square_perimeter(10)=={40}"]},  # a set: JSON cannot carry it
    {**MBPP_ROWS[1], "test_list": ["assert math.isclose(square_perimeter(1.5), 6.0)"]},
    {**MBPP_ROWS[1], "test_setup_code": "import math"},
]


def test_mbpp_rows_become_function_problems_their_reference_passes(code_sandbox):
    from helpers.data_prep import mbpp_problem

    problems = [normalize_problem(mbpp_problem(row)) for row in MBPP_ROWS]
    assert [p["fn_name"] for p in problems] == ["remove_Occ", "square_perimeter", "similar_elements"]
    assert problems[0]["tests"][0] == {"input": '["hello", "l"]', "output": '"heo"'}
    assert problems[1]["starter_code"].startswith("def square_perimeter(a):\n")
    assert ">>> square_perimeter(10)==40" in problems[1]["starter_code"]
    env = CodeEnvironment(local_judge(code_sandbox), "fraction")
    right = [fenced(p["canonical_solution"]) for p in problems]
    wrong = [fenced(p["starter_code"] + "    return None\n") for p in problems]
    scores = env.score(problems + problems, right + wrong)
    assert [s["verdict"] for s in scores] == ["accepted"] * 3 + ["wrong_answer"] * 3, scores
    assert [mbpp_problem(row) for row in MBPP_UNUSABLE] == [None] * 4
