"""Output checkers, as a judge's default checker does it.

stdin/stdout tests: the outputs are split into whitespace-separated tokens; there must be as many
tokens as expected and each must match. Line breaks and trailing whitespace do not matter, extra or
missing tokens do (a program printing one of three expected lines fails). Tokens match when equal;
only when the problem says floats (``float_tolerance``) do two numbers match within 1e-6 absolute or
relative error, and even then two integers must be equal.

Functional tests: the return value (JSON) must equal the expected JSON value: same types (a bool is
not an int), same lengths, same keys; floats within the tolerance only when the problem says floats.
"""

from __future__ import annotations

import json
import math
import re

TOLERANCE = 1e-6
_INTEGER = re.compile(r"[+-]?\d+\Z")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\Z")


def _numbers_match(expected: float, actual: float) -> bool:
    if not (math.isfinite(expected) and math.isfinite(actual)):
        return False
    return abs(actual - expected) <= TOLERANCE * max(1.0, abs(expected))


def tokens_match(expected: str, actual: str, float_tolerance: bool) -> bool:
    if expected == actual:
        return True
    if not float_tolerance:
        return False
    if _INTEGER.match(expected) and _INTEGER.match(actual):
        return int(expected) == int(actual)
    if _NUMBER.match(expected) and _NUMBER.match(actual):
        return _numbers_match(float(expected), float(actual))
    return False


def check_stdout(expected: str, actual: str, float_tolerance: bool = False) -> bool:
    expected_tokens, actual_tokens = expected.split(), actual.split()
    if len(expected_tokens) != len(actual_tokens):
        return False
    return all(tokens_match(e, a, float_tolerance) for e, a in zip(expected_tokens, actual_tokens, strict=True))


def values_match(expected, actual, float_tolerance: bool) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, int) and isinstance(actual, int):
        return expected == actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        if float_tolerance:
            return _numbers_match(float(expected), float(actual))
        return expected == actual  # exact, as Python compares an int with a float
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(
            values_match(e, a, float_tolerance) for e, a in zip(expected, actual, strict=True)
        )
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(
            values_match(expected[k], actual[k], float_tolerance) for k in expected
        )
    return type(expected) is type(actual) and expected == actual


def check_return_value(expected_json: str, actual_json: str, float_tolerance: bool = False) -> bool:
    """Compare two JSON texts as values (the program's side has been serialised in the sandbox)."""
    try:
        actual = json.loads(actual_json)
    except ValueError:
        return False
    return values_match(json.loads(expected_json), actual, float_tolerance)
