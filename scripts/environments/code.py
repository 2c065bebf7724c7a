"""Competitive programming: the completion's program is run against the problem's tests.

Rows in the project's schema (``helpers/offline_data.py``)::

    {"id": str, "statement": str, "testtype": "stdin" | "functional",
     "fn_name": str (functional only), "float_tolerance": bool (optional),
     "starter_code": str (optional), "tests": [{"input": str, "output": str}, ...]}

stdin tests feed ``input`` on standard input and compare standard output with ``output`` token by
token; functional tests call ``fn_name`` (a function, or a method of ``class Solution``) with the
JSON argument list ``input`` and compare its return value with the JSON value ``output``.

``load`` also reads the public layouts as they come from ``datasets`` (one row a line):
- code_contests (``deepmind/code_contests``): ``name``, ``description``, ``public_tests`` /
  ``private_tests`` / ``generated_tests`` as ``{"input": [...], "output": [...]}``;
- APPS / TACO: ``question``, ``input_output`` (JSON text or object with ``inputs``, ``outputs``
  and, for call-based problems, ``fn_name``), ``starter_code``;
- LiveCodeBench: ``question_content``, ``public_test_cases`` / ``private_test_cases`` (JSON text
  of ``[{"input", "output", "testtype"}]``; the private ones may be base64 + zlib of a pickled
  string, read here by walking the pickle's opcodes, never by unpickling), ``metadata`` with
  ``func_name``, ``starter_code``.

The program is the last fenced code block of the completion; without one the verdict is
``no_code``. The reward is the fraction of tests passed or, with ``reward_mode="all_or_nothing"``,
1 only when every test passes (judging stops at the first failure). The judge is given: a function
``judge(items, reward_mode) -> list[dict]`` over ``(problem, program)`` pairs, run in a local
``sandbox.Sandbox`` or by remote judge processes (``code_rl.py``).
"""

from __future__ import annotations

import base64
import json
import pickletools
import re
import time
import zlib
from collections import Counter
from collections.abc import Callable

from sandbox.judge import VERDICTS  # the verdicts a program gets, "no_code" included: named once, by the judge

SYSTEM_PROMPT = (
    "You are an expert competitive programmer. Solve the problem in Python 3. Think briefly, then "
    "give the complete solution in one ```python code block."
)
_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)

Judge = Callable[[list[tuple[dict, str]], str], list[dict]]


# --------------------------------------------------------------------------- programs


def extract_program(completion: str) -> str | None:
    """The last closed fenced code block of the completion, or None."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks and blocks[-1].strip() else None


# --------------------------------------------------------------------------- public layouts


def _text(value) -> str:
    """A test's input or output as text (some sets store a list of lines)."""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value) + ("\n" if value else "")
    if not isinstance(value, str):
        raise ValueError(f"a test input/output must be text, got {type(value).__name__}")
    return value


def _pickled_string(payload: bytes) -> str:
    """The string a pickle holds, read from its opcodes without running it (no unpickling)."""
    strings, allowed = (
        [],
        {
            "PROTO",
            "FRAME",
            "MEMOIZE",
            "STOP",
            "SHORT_BINUNICODE",
            "BINUNICODE",
            "BINUNICODE8",
            "UNICODE",
            "PUT",
            "BINPUT",
            "LONG_BINPUT",
        },
    )
    for opcode, argument, _ in pickletools.genops(payload):
        if opcode.name not in allowed:
            raise ValueError(
                f"compressed test cases hold a pickle with opcode {opcode.name}, not a plain string; "
                "refusing to unpickle data set content"
            )
        if isinstance(argument, str) and "UNICODE" in opcode.name:
            strings.append(argument)
    if len(strings) != 1:
        raise ValueError("compressed test cases do not hold exactly one string")
    return strings[0]


def _livecodebench_cases(field) -> list[dict]:
    if isinstance(field, list):
        return field
    if not field:
        return []
    try:
        return json.loads(field)
    except json.JSONDecodeError:
        pass
    try:
        return json.loads(_pickled_string(zlib.decompress(base64.b64decode(field))))
    except (ValueError, zlib.error) as error:
        raise ValueError(
            f"private_test_cases is neither JSON nor base64+zlib of a pickled JSON string ({error})"
        ) from None


def _from_livecodebench(row: dict) -> dict:
    cases = _livecodebench_cases(row.get("public_test_cases")) + _livecodebench_cases(row.get("private_test_cases"))
    if not cases:
        raise ValueError("no test cases in public_test_cases/private_test_cases")
    testtype = cases[0].get("testtype", "stdin")
    problem = {
        "id": str(row.get("question_id", row.get("question_title", ""))),
        "statement": row["question_content"],
        "testtype": testtype,
        "starter_code": row.get("starter_code") or "",
    }
    if testtype == "functional":
        metadata = row.get("metadata") or {}
        metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
        if "func_name" not in metadata:
            raise ValueError("functional problem without metadata.func_name")
        problem["fn_name"] = metadata["func_name"]
        # LiveCodeBench writes one JSON value per line, one line per argument.
        problem["tests"] = [
            {
                "input": json.dumps([json.loads(line) for line in case["input"].split("\n") if line.strip()]),
                "output": case["output"],
            }
            for case in cases
        ]
    else:
        problem["tests"] = [{"input": case["input"], "output": case["output"]} for case in cases]
    return problem


def _from_code_contests(row: dict) -> dict:
    tests = []
    for split in ("public_tests", "private_tests", "generated_tests"):
        block = row.get(split) or {}
        inputs, outputs = block.get("input") or [], block.get("output") or []
        if len(inputs) != len(outputs):
            raise ValueError(f"{split}: {len(inputs)} inputs but {len(outputs)} outputs")
        tests += [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
    return {"id": str(row.get("name", "")), "statement": row["description"], "testtype": "stdin", "tests": tests}


def _from_apps(row: dict) -> dict:
    spec = row["input_output"]
    spec = json.loads(spec) if isinstance(spec, str) else spec
    inputs, outputs = spec.get("inputs") or [], spec.get("outputs") or []
    if len(inputs) != len(outputs):
        raise ValueError(f"input_output: {len(inputs)} inputs but {len(outputs)} outputs")
    problem = {
        "id": str(row.get("problem_id", row.get("id", ""))),
        "statement": row["question"],
        "starter_code": row.get("starter_code") or "",
    }
    if spec.get("fn_name"):
        problem.update(testtype="functional", fn_name=spec["fn_name"])
        # APPS wraps each expected return value in a one-element list.
        problem["tests"] = [
            {
                "input": json.dumps(i if isinstance(i, list) else [i]),
                "output": json.dumps(o[0] if isinstance(o, list) and len(o) == 1 else o),
            }
            for i, o in zip(inputs, outputs, strict=True)
        ]
    else:
        problem.update(testtype="stdin")
        problem["tests"] = [{"input": _text(i), "output": _text(o)} for i, o in zip(inputs, outputs, strict=True)]
    return problem


def normalize_problem(row: dict) -> dict:
    """A row of any supported layout as a problem in the project's schema (ValueError if unusable)."""
    if "tests" in row and "statement" in row:
        problem = dict(row)
    elif "question_content" in row:
        problem = _from_livecodebench(row)
    elif "description" in row and any(k in row for k in ("public_tests", "private_tests", "generated_tests")):
        problem = _from_code_contests(row)
    elif "question" in row and "input_output" in row:
        problem = _from_apps(row)
    else:
        raise ValueError(
            f"unknown problem layout (fields {sorted(row)}); expected the project's "
            "{id, statement, testtype, tests} or code_contests / APPS / TACO / LiveCodeBench rows"
        )
    problem.setdefault("testtype", "stdin")
    if problem["testtype"] not in ("stdin", "functional"):
        raise ValueError(f"field 'testtype' must be 'stdin' or 'functional', got {problem['testtype']!r}")
    if problem["testtype"] == "functional" and not problem.get("fn_name"):
        raise ValueError("a functional problem needs field 'fn_name'")
    if not isinstance(problem.get("tests"), list) or not problem["tests"]:
        raise ValueError("field 'tests' must be a non-empty list of {input, output}")
    for index, test in enumerate(problem["tests"]):
        if (
            not isinstance(test, dict)
            or not isinstance(test.get("input"), str)
            or not isinstance(test.get("output"), str)
        ):
            raise ValueError(f"tests[{index}] must be {{'input': str, 'output': str}}")
        if problem["testtype"] == "functional":
            try:
                json.loads(test["input"])
                json.loads(test["output"])
            except json.JSONDecodeError:
                raise ValueError(f"tests[{index}]: a functional test's input and output must be JSON text") from None
    problem["float_tolerance"] = bool(problem.get("float_tolerance", False))
    return problem


# --------------------------------------------------------------------------- the environment


class CodeEnvironment:
    """Code problems judged in a sandbox (see ``environments/__init__.py`` for the protocol).

    ``judge(items, reward_mode)`` gets ``(problem, program)`` pairs and returns one dict per pair
    with ``verdict``, ``reward``, ``passed``, ``total``. ``step_metrics()`` gives the verdict rates
    (``accepted_rate``, ..., ``test_pass_fraction``: mean share of a program's tests passed) and ``judge_time`` of the completions scored since its
    last call, which the GRPO loop adds to the step's metric record.
    """

    name = "code"

    def __init__(self, judge: Judge | None = None, reward_mode: str = "fraction", max_tests: int = 0):
        if reward_mode not in ("fraction", "all_or_nothing"):
            raise ValueError(f"reward_mode must be 'fraction' or 'all_or_nothing', got {reward_mode!r}")
        self.judge = judge
        self.reward_mode = reward_mode
        self.max_tests = max_tests
        self.scored: list[dict] = []  # verdict, passed, total of each completion since the last step_metrics()
        self.judge_time = 0.0

    def load(self, path) -> list[dict]:
        from common import data  # the validated JSON Lines reader the job scripts use (torch-free to import)

        rows = data.read_jsonl(path, [], check=normalize_problem)
        problems = [normalize_problem(row) for row in rows]
        if self.max_tests:
            for problem in problems:
                problem["tests"] = problem["tests"][: self.max_tests]
        return problems

    def prompt_messages(self, example: dict) -> list[dict]:
        if example["testtype"] == "functional":
            task = (
                f"Write a Python function `{example['fn_name']}` (a plain function, or a method of "
                f"`class Solution`); it is called with the test's arguments and its return value is checked."
            )
            if example.get("starter_code"):
                task += f"\nStart from:\n```python\n{example['starter_code']}\n```"
        else:
            task = "Read the input from standard input and print the answer to standard output."
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{example['statement']}\n\n{task}"},
        ]

    def score(self, examples: list[dict], completions: list[str]) -> list[dict]:
        if self.judge is None:
            raise RuntimeError("CodeEnvironment has no judge: pass judge=... (a sandbox or the remote judges)")
        started = time.perf_counter()
        programs = [extract_program(c) for c in completions]
        # The judge needs only what it runs: never the statement, and only this problem's tests.
        items = [
            ({k: example[k] for k in ("testtype", "fn_name", "float_tolerance", "tests") if k in example}, program)
            for example, program in zip(examples, programs, strict=True)
            if program is not None
        ]
        judged = iter(self.judge(items, self.reward_mode) if items else [])
        scores = []
        for example, program in zip(examples, programs, strict=True):
            if program is None:
                result = {"verdict": "no_code", "reward": 0.0, "passed": 0, "total": len(example["tests"])}
            else:
                result = dict(next(judged))
            result["correct"] = result["verdict"] == "accepted"
            result["format_reward"] = 0.0 if program is None else 1.0
            scores.append(result)
        self.scored += [{k: s[k] for k in ("verdict", "passed", "total")} for s in scores]
        self.judge_time += time.perf_counter() - started
        return scores

    def step_metrics(self) -> dict[str, float]:
        """Verdict rates and judging time of the completions scored since the last call (see the protocol)."""
        stats = verdict_stats(self.scored, self.judge_time)
        self.scored, self.judge_time = [], 0.0
        return stats


def verdict_stats(scores: list[dict], judge_time: float) -> dict[str, float]:
    """Share of each verdict, mean fraction of tests passed, and the time judging took."""
    counts = Counter(s["verdict"] for s in scores)
    n = max(len(scores), 1)
    stats = {f"{verdict}_rate": counts.get(verdict, 0) / n for verdict in VERDICTS}
    stats["test_pass_fraction"] = sum(s["passed"] / s["total"] for s in scores if s["total"]) / n
    stats["judge_time"] = judge_time
    return stats


def local_judge(sandbox) -> Judge:
    """A judge running programs in ``sandbox`` (a started ``sandbox.Sandbox``) in this process."""

    def judge(items: list[tuple[dict, str]], reward_mode: str) -> list[dict]:
        return [
            {
                "verdict": j.verdict,
                "reward": j.reward,
                "passed": j.passed,
                "total": j.total,
                "detail": next((o.detail for o in j.outcomes if o.verdict == j.verdict and o.detail), "")[:300],
            }
            for j in sandbox.judge_many(items, reward_mode)
        ]

    return judge
