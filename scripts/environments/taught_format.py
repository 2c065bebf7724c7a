"""Whether a model answers in the format its SFT data teaches: the lesson an SFT run can show on held-out
prompts, beside its held-out loss.

The format is read off each held-out conversation's reference answer (its last assistant turn), and an
answer is checked the way the matching RL environment's ``format_reward`` checks it, so SFT and RL mean
the same thing by "in format":

- ``"final_line"``: the reference ends with ``#### <number>`` (GSM8K); the answer must end with such a line
  (``environments.gsm8k.has_final_line``);
- ``"program"``: the reference holds a fenced program (code problems); the answer must hold a closed fenced
  block with code in it (``environments.code.extract_program``);
- anything else (small talk) teaches no format this module checks, and is left out of the share.

Used by ``sft.py`` (the training jobs of notebooks 1 and 11) and by notebook 7's session loop
(``helpers.training_sessions.sft``).
"""

from __future__ import annotations

from collections.abc import Sequence

from common import stats

from environments.code import extract_program
from environments.gsm8k import extract_answer, has_final_line

FORMATS = {
    "final_line": "a final '#### <number>' line",
    "program": "one fenced program",
}


def taught_format(reference: str) -> str | None:
    """The format the reference answer teaches (a key of ``FORMATS``), or None where it teaches none."""
    if has_final_line(reference):
        return "final_line"
    if extract_program(reference) is not None:
        return "program"
    return None


def in_format(answer_format: str, answer: str) -> bool:
    """Whether ``answer`` is in ``answer_format`` (a key of ``FORMATS``)."""
    if answer_format == "final_line":
        return has_final_line(answer)
    if answer_format == "program":
        return extract_program(answer) is not None
    raise ValueError(f"Unknown answer format {answer_format!r}; choose one of {', '.join(FORMATS)}.")


def given_answer(answer_format: str, answer: str) -> str | None:
    """The answer as ``stats.answer_diversity`` counts it: the final number (as the GSM8K checker reads it)
    or the program (as the code judge would run it)."""
    if answer_format == "final_line":
        return stats.given_answer(answer, {"extracted": extract_answer(answer)})
    return stats.given_answer(answer, {"verdict": None})


def format_evaluation(references: Sequence[str], answers: Sequence[str]) -> dict:
    """One model's answers to the held-out prompts whose references teach a format (``answers[i]`` answers
    the prompt of ``references[i]``): ``share`` of answers in that format and its ``standard_error`` over
    conversations, ``conversations``, ``per_conversation`` (1.0 or 0.0, for a paired change) and the
    ``answer_diversity`` of the answers given (numbers and programs), so that a collapse shows."""
    if len(references) != len(answers):
        raise ValueError(f"{len(answers)} answers for {len(references)} reference answers: give one answer each.")
    formats = [taught_format(reference) for reference in references]
    pairs = [(f, answer) for f, answer in zip(formats, answers, strict=True) if f is not None]
    if not pairs:
        raise ValueError(
            "None of the held-out reference answers teaches a format this check knows (a final '#### <number>' "
            "line, or a fenced program): the share of answers in the taught format cannot be measured."
        )
    per_conversation = [1.0 if in_format(f, answer) else 0.0 for f, answer in pairs]
    share, standard_error = stats.mean_and_standard_error(per_conversation)
    return {
        "share": share,
        "standard_error": standard_error,
        "conversations": len(pairs),
        "per_conversation": per_conversation,
        "answer_diversity": stats.answer_diversity([given_answer(f, answer) for f, answer in pairs]),
    }
