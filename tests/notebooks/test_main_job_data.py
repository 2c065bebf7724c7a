"""The offline data the main job learns from: SFT conversations ask exactly as the RL environments
ask, and answer in the formats their rewards check, so SFT teaches what GRPO and code RL reward."""

from __future__ import annotations

import json
import subprocess
import sys

from environments.code import CodeEnvironment, extract_program
from environments.gsm8k import GSM8KEnvironment

from local_mode import offline_data


def test_easy_gsm8k_answers_pass_the_checker_with_full_format_reward():
    env = GSM8KEnvironment()
    problems = offline_data.gsm8k_easy_records(60, seed=3)
    scores = env.score(problems, [offline_data.solution_text(p["answer"]) for p in problems])
    assert all(s["correct"] and s["format_reward"] == 1.0 for s in scores)
    assert max(int(s["reference"]) for s in scores) <= 30  # easy: small numbers only
    assert len({p["question"] for p in problems}) > 40  # names, items and numbers vary


def test_sft_conversations_ask_as_the_environments_ask():
    gsm8k_system = GSM8KEnvironment().prompt_messages({"question": "q"})[0]["content"]
    code_env = CodeEnvironment(judge=None)
    prompts = {json.dumps(code_env.prompt_messages(p)) for p in offline_data.code_problem_records(10)}
    kinds = {"maths": 0, "code": 0, "other": 0}
    for record in offline_data.chat_records(64):
        messages = record["messages"]
        if messages[0]["content"] == gsm8k_system:
            assert (
                GSM8KEnvironment().score([{"answer": "#### 0"}], [messages[-1]["content"]])[0]["format_reward"] == 1.0
            )
            kinds["maths"] += 1
        elif messages[0]["role"] == "system":
            assert json.dumps(messages[:2]) in prompts, messages[:2]
            assert extract_program(messages[-1]["content"]) is not None
            kinds["code"] += 1
        else:
            kinds["other"] += 1
    assert kinds == {"maths": 40, "code": 16, "other": 8}


def test_sft_programs_pass_their_problems_tests(tmp_path):
    for problem in offline_data.code_problem_records(len(offline_data.CODE_TEMPLATES)):
        program = extract_program(offline_data.code_solution(problem))
        for test in problem["tests"]:
            if problem["testtype"] == "functional":
                source = program + f"\nimport json\nprint(json.dumps(solve(*json.loads({test['input']!r}))))\n"
                stdin, expected = "", test["output"]
            else:
                source, stdin, expected = program, test["input"], test["output"]
            out = subprocess.run(
                [sys.executable, "-c", source], input=stdin, capture_output=True, text=True, timeout=30, check=True
            ).stdout
            if problem.get("float_tolerance"):
                assert abs(float(out) - float(expected)) < 1e-6, (problem["id"], out, expected)
            else:
                assert out.split() == expected.split(), (problem["id"], out, expected)
