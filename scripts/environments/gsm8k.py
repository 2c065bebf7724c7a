"""GSM8K: grade-school maths word problems with a numeric answer, checked by value.

Rows are ``{"question": str, "answer": str}`` where the answer is a worked solution ending in
``#### <number>`` (the format of ``openai/gsm8k``). The model is asked to reason step by step and
to end with the same ``#### <answer>`` line.

Reading the model's answer, in order of preference:
1. the first number after the last ``####``;
2. else the last number inside the last ``\\boxed{...}`` (``\\frac{a}{b}`` read as ``a/b``);
3. else the last number anywhere in the completion.
Numbers are compared as exact values: ``1,000`` = ``1000``, ``$5.00`` = ``5``, ``72.0`` = ``72``,
``3/4`` = ``0.75``, signs kept. Reward 1 for the right value, 0 otherwise. ``format_reward`` is 1
when the completion ends with ``#### <number>``; the loop adds it with ``--format_reward_weight``.
"""

from __future__ import annotations

import re
from fractions import Fraction

SYSTEM_PROMPT = "You are a helpful assistant. Solve the problem step by step and end with '#### <answer>'."

# A number as people write it in answers: optional sign (not a hyphen between two words or numbers),
# optional dollar sign, digits with thousands separators or plain, optional decimals, optional /denominator.
NUMBER = r"(?:(?<![\w)])[-+])?(?:\$\s?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?"
NUMBER_RE = re.compile(NUMBER)
FINAL_LINE_RE = re.compile(r"####\s*(" + NUMBER + r")\s*$")
FRAC_RE = re.compile(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}")


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number as written (``"$1,000.00"`` -> 1000, ``"3/4"`` -> 3/4), or None."""
    cleaned = text.replace("$", "").replace(",", "").replace(" ", "").strip().rstrip(".")
    if not cleaned:
        return None
    try:
        numerator, _, denominator = cleaned.partition("/")
        value = Fraction(numerator)
        if denominator:
            value /= Fraction(denominator)
        return value
    except (ValueError, ZeroDivisionError):
        return None


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, with nested braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin - 1, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:index]
    return None  # unbalanced: the completion was cut off inside the box


def extract_answer(completion: str) -> str | None:
    """The number the completion gives as its answer (as written), or None if it gives none."""
    if "####" in completion:
        found = NUMBER_RE.search(completion.rsplit("####", 1)[1])
        if found:
            return found.group(0).strip()
    boxed = _last_boxed(completion)
    if boxed is not None:
        numbers = NUMBER_RE.findall(FRAC_RE.sub(r"\1/\2", boxed))
        if numbers:
            return numbers[-1].strip()
    numbers = NUMBER_RE.findall(completion)
    return numbers[-1].strip() if numbers else None


def reference_answer(answer: str) -> str:
    """The reference number of a GSM8K answer: the text after its last ``####``."""
    return answer.rsplit("####", 1)[1].strip()


def is_correct(completion: str, reference: str) -> bool:
    extracted = extract_answer(completion)
    if extracted is None:
        return False
    value, expected = parse_number(extracted), parse_number(reference)
    return value is not None and expected is not None and value == expected


def has_final_line(completion: str) -> bool:
    """Whether the completion ends with ``#### <number>`` as the prompt asks."""
    return FINAL_LINE_RE.search(completion.strip()) is not None


def _check_row(row: dict) -> None:
    if not isinstance(row["question"], str) or not isinstance(row["answer"], str):
        raise ValueError("fields 'question' and 'answer' must be text.")
    if "####" not in row["answer"]:
        raise ValueError("field 'answer' has no '#### <number>' line; GSM8K answers end with '#### <final number>'.")
    if parse_number(reference_answer(row["answer"])) is None:
        raise ValueError(
            f"field 'answer': the text after '####' ({reference_answer(row['answer'])!r}) is not a number."
        )


class GSM8KEnvironment:
    """The GSM8K environment (see ``environments/__init__.py`` for the protocol)."""

    name = "gsm8k"

    def load(self, path) -> list[dict]:
        from common import data  # the validated JSON Lines reader the job scripts use (torch-free to import)

        return data.read_jsonl(path, ["question", "answer"], check=_check_row)

    def prompt_messages(self, example: dict) -> list[dict]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": example["question"]}]

    def score(self, examples: list[dict], completions: list[str]) -> list[dict]:
        scores = []
        for example, completion in zip(examples, completions, strict=True):
            reference = reference_answer(example["answer"])
            correct = is_correct(completion, reference)
            scores.append(
                {
                    "reward": 1.0 if correct else 0.0,
                    "correct": correct,
                    "format_reward": 1.0 if has_final_line(completion) else 0.0,
                    "extracted": extract_answer(completion),
                    "reference": reference,
                }
            )
        return scores
