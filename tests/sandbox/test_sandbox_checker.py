"""The output checker: tokens, exact integers, tolerance only for float problems; never zipped lines."""

import pytest
from sandbox.checker import check_return_value, check_stdout


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        ("3\n", "3\n", True),
        ("3\n", "3", True),  # no final newline
        ("1 2\n3\n", "1 2   \n3  \n\n", True),  # trailing whitespace and blank lines
        ("1 2\n3\n", "1\n2 3\n", True),  # tokens, not lines
        ("1\n2\n3\n", "1\n", False),  # one of three lines (zipping lines would pass it)
        ("1\n2\n3\n", "1\n2\n3\n4\n", False),  # an extra token
        ("1\n", "1 extra\n", False),
        ("", "", True),
        ("", "0\n", False),
        ("YES\n", "yes\n", False),  # case matters
        ("5\n", "5.0000001\n", False),  # integer problem: exact
        ("5\n", "05\n", False),
        ("0.5\n", "0.5000001\n", False),  # no tolerance unless the problem says floats
    ],
)
def test_exact_token_comparison(expected, actual, ok):
    assert check_stdout(expected, actual, float_tolerance=False) is ok


@pytest.mark.parametrize(
    "expected, actual, ok",
    [
        ("0.333333\n", "0.3333333333\n", True),
        ("1000000.0\n", "1000000.5\n", True),  # relative 5e-7
        ("1000000.0\n", "1000002\n", False),  # relative 2e-6
        ("1.0\n", "1.000002\n", False),
        ("0.0\n", "0.0000005\n", True),  # absolute 5e-7
        ("2.5 7\n", "2.5000001 7\n", True),
        ("7\n", "8\n", False),  # two integers are still compared exactly
        ("3\n", "3.0000001\n", True),  # an integer against a float: tolerance
        ("nan\n", "nan\n", True),  # identical tokens
        ("1.0\n", "nan\n", False),
        ("1.0\n", "inf\n", False),
        ("1.0\n", "1.0 2.0\n", False),
        ("abc\n", "abd\n", False),
    ],
)
def test_float_tolerance(expected, actual, ok):
    assert check_stdout(expected, actual, float_tolerance=True) is ok


@pytest.mark.parametrize(
    "expected, actual, tolerance, ok",
    [
        ("[1, 2]", "[1, 2]", False, True),
        ("[1, 2]", "[1, 2, 3]", False, False),
        ("[1, 2]", "[2, 1]", False, False),
        ("true", "1", False, False),  # a bool is not an int
        ("1", "true", False, False),
        ("2", "2.0", False, True),  # equal numbers
        ("0.1", "0.1000001", False, False),
        ("0.1", "0.1000001", True, True),
        ('{"a": [1.5]}', '{"a": [1.5000001]}', True, True),
        ('{"a": 1}', '{"b": 1}', False, False),
        ('"abc"', '"abc"', False, True),
        ("null", "null", False, True),
        ("[1]", "not json", False, False),
    ],
)
def test_return_values(expected, actual, tolerance, ok):
    assert check_return_value(expected, actual, tolerance) is ok
