"""Held-out figures with their noise: a mean with its standard error, and a paired change; the answers
behind them: how many distinct answers a model gave, whether they collapsed into one, and so whether a
change counts as a gain.

Torch-free, so the job scripts, the session loops and the notebook helpers share one definition
(``common.stats``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """The mean of independent values and its standard error (sample std / sqrt(n); 0 for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_and_standard_error needs at least one value")
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def paired_change(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """After minus before on the same items (problems), and the standard error of that change, from the
    per-item differences: each item's own difficulty cancels out, so it is smaller than the two
    figures' errors combined."""
    if len(before) != len(after):
        raise ValueError(f"a paired change needs the same items before and after, got {len(before)} and {len(after)}")
    return mean_and_standard_error([a - b for a, b in zip(after, before, strict=True)])


# --------------------------------------------------------------------------- answers: learned or collapsed

# A held-out figure can rise without learning: a model that gives one answer to every problem scores the
# share of problems whose reference is that answer (GSM8K's references are small numbers, and several
# problems share one). The rule: when more than this share of the evaluated answers is one answer, the
# model has collapsed ("most answers are one answer"), and no change of its figure counts as a gain.
COLLAPSE_SHARE = 0.5
# A change counts as a gain only beyond this many of its (paired) standard errors, and without collapse.
GAIN_STANDARD_ERRORS = 2.0


def given_answer(completion: str, score: dict) -> str | None:
    """The answer a completion gives, as ``answer_diversity`` counts it; None when it gives none.

    - GSM8K (its checker reads a final number, ``extracted`` in the score): that number as the checker read
      it, without surrounding white space;
    - code (the judge's ``verdict``): the program the judge ran (the completion's last fenced block,
      ``environments.code.extract_program``), each line without trailing white space and blank lines left
      out; None for ``no_code``. Two answers are one when their programs are, whatever prose surrounds them;
    - any other environment: the completion, its runs of white space made one space.
    """
    if "extracted" in score:
        return None if score["extracted"] is None else str(score["extracted"]).strip()
    if "verdict" in score:
        from environments.code import extract_program  # scored where scripts/ is on the path: jobs, session loops

        program = extract_program(completion)
        if program is None:
            return None
        return "\n".join(line.rstrip() for line in program.splitlines() if line.strip())
    return " ".join(completion.split()) or None


def answer_diversity(answers: Sequence[str | None]) -> dict:
    """How many distinct answers a model gave to an evaluation, and how much of it its most common answer
    is: ``answers`` (evaluated: every answer to every problem), ``no_answer`` (None: no final number, no
    program), ``distinct_answers`` (among the given ones), ``most_common_answer`` (None when none was
    given), ``most_common_count`` and ``most_common_share`` (of all the evaluated answers)."""
    if not answers:
        raise ValueError("answer_diversity needs at least one answer")
    given = Counter(answer for answer in answers if answer is not None)
    top, count = given.most_common(1)[0] if given else (None, 0)
    return {
        "answers": len(answers),
        "no_answer": len(answers) - sum(given.values()),
        "distinct_answers": len(given),
        "most_common_answer": top,
        "most_common_count": count,
        "most_common_share": count / len(answers),
    }


def collapsed(diversity: dict) -> bool:
    """Whether most of the evaluated answers are one answer (``COLLAPSE_SHARE``)."""
    return diversity["most_common_share"] > COLLAPSE_SHARE


def _shown(answer: str, width: int = 40) -> str:
    return repr(answer if len(answer) <= width else answer[:width] + "...")


def describe_answers(diversity: dict) -> str:
    """'32 answers, 14 distinct; the most common, '18', 5 of 32' (and how many gave no answer),
    'collapsed: 32 of 32 answers are '2'', or 'none of the 32 completions gave an answer'."""
    n, top, count = diversity["answers"], diversity["most_common_answer"], diversity["most_common_count"]
    if collapsed(diversity):
        return f"collapsed: {count} of {n} answers are {_shown(top)}"
    if top is None:
        return f"none of the {n} completions gave an answer"
    text = f"{n} answers, {diversity['distinct_answers']} distinct; the most common, {_shown(top)}, {count} of {n}"
    if diversity["no_answer"]:
        text += f"; {diversity['no_answer']} without an answer"
    return text


def describe_answers_before_and_after(before: dict | None, after: dict | None) -> str | None:
    """'answers before: ...; after: ...' (``describe_answers`` of each that was counted), or None."""
    shown = [f"{label}: {describe_answers(d)}" for label, d in (("before", before), ("after", after)) if d is not None]
    return "answers " + "; ".join(shown) if shown else None


def counts_as_gain(change: float, standard_error: float, after: dict | None) -> bool:
    """A change counts as a gain when it is beyond ``GAIN_STANDARD_ERRORS`` of its standard error (which must
    be measured: above 0) and the trained model's answers (``after``, ``answer_diversity``) did not collapse.
    ``after`` None: an evaluation from before answers were counted, which cannot show that."""
    return (
        after is not None
        and standard_error > 0
        and change > GAIN_STANDARD_ERRORS * standard_error
        and not collapsed(after)
    )


def judge_change(change: float, standard_error: float, after: dict | None) -> str:
    """What a paired change means, in words: its size in standard errors, then whether it counts as a gain
    (``counts_as_gain``), and if not, why."""
    size = f"{change / standard_error:+.1f} standard errors" if standard_error else "no spread to measure it against"
    if after is not None and collapsed(after):
        return f"{size}; {describe_answers(after)}, not counted as a gain"
    if counts_as_gain(change, standard_error, after):
        return f"{size}: a gain"
    if after is None:
        return f"{size}; the evaluation did not count its answers (an older one), not counted as a gain"
    if not standard_error:
        return f"{size}: not a gain"
    if change < -GAIN_STANDARD_ERRORS * standard_error:
        return f"{size}: a loss"
    return f"{size}: within {GAIN_STANDARD_ERRORS:g} standard errors, not a gain"


# --------------------------------------------------------------------------- seen and unseen templates

# A held-out problem can say which part of the held-out set it belongs to (its "split"): "seen", a template
# the training problems use, with other names and numbers; "unseen", a template no training problem uses,
# the same skill in other words. The same rule judges each part; what a gain means differs.
SPLIT_GAIN = {"seen": "recall of a pattern", "unseen": "transfer"}  # what a gain on each part is
SPLIT_MEANING = {
    "seen": f"templates the training problems use; a rise here is {SPLIT_GAIN['seen']}",
    "unseen": f"templates no training problem uses; a rise here is {SPLIT_GAIN['unseen']}",
}


def by_split(splits: Sequence[str | None], per_item: Sequence[float], answers: Sequence[Sequence[str | None]]) -> dict:
    """One evaluation's figures per split: for each split some items name (``splits[i]``, None: none), the
    mean of their ``per_item`` values (``accuracy``), its ``standard_error``, ``n``, ``per_item`` (for a
    paired change) and the ``answer_diversity`` of their ``answers`` (``answers[i]``: item i's answers).
    {} when no item names a split (a set without them, such as openai/gsm8k)."""
    found = {}
    for name in sorted({split for split in splits if split is not None}):
        mine = [i for i, split in enumerate(splits) if split == name]
        values = [per_item[i] for i in mine]
        accuracy, standard_error = mean_and_standard_error(values)
        found[name] = {
            "accuracy": accuracy,
            "standard_error": standard_error,
            "n": len(mine),
            "per_item": values,
            "answer_diversity": answer_diversity([a for i in mine for a in answers[i]]),
        }
    return found


def paired_by_split(before: dict, after: dict, whole_after: dict | None = None) -> dict:
    """Two ``by_split`` results of the same items: each split's figure before and after with its standard
    error, the paired change with its own, ``n``, and each model's answer diversity (``judge_change`` reads
    the change and ``after_answer_diversity``, as for the whole set). A model whose answers to the whole set
    collapsed (``whole_after``) has collapsed on each part too, even where a part's own answers are less
    uniform: that part's ``after_answer_diversity`` is then the whole set's, so no part's change is a gain."""
    found = {}
    for name in sorted(before.keys() & after.keys()):
        b, a = before[name], after[name]
        change, change_standard_error = paired_change(b["per_item"], a["per_item"])
        after_answers = whole_after if whole_after is not None and collapsed(whole_after) else a["answer_diversity"]
        found[name] = {
            "before": b["accuracy"],
            "before_standard_error": b["standard_error"],
            "after": a["accuracy"],
            "after_standard_error": a["standard_error"],
            "change": change,
            "change_standard_error": change_standard_error,
            "n": b["n"],
            "before_answer_diversity": b["answer_diversity"],
            "after_answer_diversity": after_answers,
        }
    return found


def describe_split(name: str, figures: dict) -> str:
    """'unseen templates (16 problems; ...; a rise here is transfer): 0.250 ± 0.108 -> 0.375 ± 0.125,
    change +0.125 ± 0.085, +1.5 standard errors: within 2 standard errors, not a gain' (``paired_by_split``)."""
    meaning = SPLIT_MEANING.get(name, "a part of the held-out set")
    return (
        f"{name} templates ({figures['n']} problems; {meaning}): {figures['before']:.3f} ± "
        f"{figures['before_standard_error']:.3f} -> {figures['after']:.3f} ± {figures['after_standard_error']:.3f}, "
        f"change {figures['change']:+.3f} ± {figures['change_standard_error']:.3f}, "
        + judge_change(figures["change"], figures["change_standard_error"], figures.get("after_answer_diversity"))
    )
