"""Small data sets in the real formats, written by the project itself.

Tests, local mode and the main job need GSM8K-style problems, preference pairs, chat
conversations and competitive-programming problems without any download. Each writer
is deterministic for a seed and writes JSON Lines, one record a line, in the layout the
training scripts read from a SageMaker channel (``train.jsonl`` / ``test.jsonl``).

In the cloud the data-preparation notebook loads the real sets by name with
``datasets`` (``openai/gsm8k`` and friends) and writes the same layouts.

The offline GSM8K set (``DATASETS["gsm8k"]``) holds easy one-step problems with small numbers,
some of which only ask for a number the question states: problems a 1 M-parameter model can
begin to solve after a short SFT, so that GRPO's reward is above zero from its first steps.
Its held-out split (``split_records``) is half problems of the training templates with other names
and numbers ("seen": a gain there is recall of a pattern) and half problems of templates the
training split never uses ("unseen": the same skills in other words; a gain there is transfer).
The arithmetic set (``DATASETS["arithmetic"]``, offline only) asks the easy set's sums and differences
with three-digit numbers, halved the same way: one step a small model gets wrong in its head and a
Python tool gets right (notebook 15). The worded multi-step problems (``gsm8k_records``) make the
preference pairs, and the SFT conversations mix both kinds with short programs for the code problems, so that SFT teaches
the answer formats the RL notebooks reward (``#### <number>``, one fenced Python block).

Formats:
- GSM8K:       {"question": str, "answer": "<worked solution>\\n#### <number>"}; the offline set adds
               "template" (the template's name) and, in its test split, "split" ("seen" or "unseen")
- preferences: {"prompt": str, "chosen": str, "rejected": str}
- chat (SFT):  {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}
- code:        {"id": str, "statement": str, "testtype": "stdin"|"functional",
                "fn_name": str (functional only), "float_tolerance": bool (optional),
                "tests": [{"input": str, "output": str}, ...]}
  For functional problems ``input`` is the JSON text of the argument list and ``output``
  the JSON text of the return value.
- functions:   code problems of the functional kind, posed as HumanEval poses them, with
               "starter_code" (signature and docstring) and "canonical_solution" (its body).
"""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from environments.code import CodeEnvironment
from environments.gsm8k import SYSTEM_PROMPT, GSM8KEnvironment

NAMES = [
    "Natalia",
    "Weng",
    "Betty",
    "Julie",
    "James",
    "Albert",
    "Ken",
    "Alexis",
    "Tina",
    "Mark",
    "Priya",
    "Omar",
    "Lena",
    "Diego",
    "Mei",
    "Sam",
]
ITEMS = ["apples", "pencils", "stickers", "cookies", "marbles", "books", "cards", "shells"]


# --------------------------------------------------------------------------- GSM8K style


def _problem_sold_half(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    first = 2 * rng.randint(5, 60)
    second = first // 2
    total = first + second
    question = (
        f"{name} sold {first} {item} in April, and then sold half as many {item} in May. "
        f"How many {item} did {name} sell altogether in April and May?"
    )
    steps = [
        f"{name} sold {first}/2 = <<{first}/2={second}>>{second} {item} in May.",
        f"{name} sold {first}+{second} = <<{first}+{second}={total}>>{total} {item} altogether.",
    ]
    return question, steps, total


def _problem_hourly_pay(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    rate, hours = rng.randint(8, 30), rng.randint(2, 12)
    total = rate * hours
    question = f"{name} earns ${rate} an hour for babysitting. Yesterday, {name} babysat for {hours} hours. How much did {name} earn?"
    steps = [f"{name} earned {rate}*{hours} = <<{rate}*{hours}={total}>>{total} dollars."]
    return question, steps, total


def _problem_saving(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(["bike", "guitar", "wallet", "backpack"])
    price = rng.randint(50, 400)
    saved = rng.randint(1, price - 1)
    gift = rng.randint(0, price - saved)
    need = price - saved - gift
    question = (
        f"{name} wants a new {item} that costs ${price}. {name} has saved ${saved} and a friend gives "
        f"{name} ${gift}. How much more money does {name} need?"
    )
    steps = [
        f"{name} has {saved}+{gift} = <<{saved}+{gift}={saved + gift}>>{saved + gift} dollars.",
        f"{name} needs {price}-{saved + gift} = <<{price}-{saved + gift}={need}>>{need} more dollars.",
    ]
    return question, steps, need


def _problem_boxes(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    boxes, per_box, given = rng.randint(2, 9), rng.randint(3, 12), rng.randint(1, 10)
    have = boxes * per_box
    given = min(given, have)
    left = have - given
    question = (
        f"{name} has {boxes} boxes with {per_box} {item} in each box. {name} gives away {given} {item}. "
        f"How many {item} does {name} have left?"
    )
    steps = [
        f"{name} starts with {boxes}*{per_box} = <<{boxes}*{per_box}={have}>>{have} {item}.",
        f"After giving some away, {name} has {have}-{given} = <<{have}-{given}={left}>>{left} {item}.",
    ]
    return question, steps, left


def _problem_pages(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    per_day, days, extra = rng.randint(5, 40), rng.randint(2, 7), rng.randint(0, 30)
    read = per_day * days
    total = read + extra
    question = (
        f"{name} reads {per_day} pages a day for {days} days and then {extra} pages on the weekend. "
        f"How many pages did {name} read in total?"
    )
    steps = [
        f"On weekdays {name} read {per_day}*{days} = <<{per_day}*{days}={read}>>{read} pages.",
        f"In total {name} read {read}+{extra} = <<{read}+{extra}={total}>>{total} pages.",
    ]
    return question, steps, total


def _problem_share(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each = rng.randint(2, 8), rng.randint(2, 15)
    total = friends * each
    question = f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?"
    steps = [f"Each friend gets {total}/{friends} = <<{total}/{friends}={each}>>{each} {item}."]
    return question, steps, each


GSM8K_TEMPLATES: list[Callable[[random.Random], tuple[str, list[str], int]]] = [
    _problem_sold_half,
    _problem_hourly_pay,
    _problem_saving,
    _problem_boxes,
    _problem_pages,
    _problem_share,
]


# Easy problems: one step, numbers below 10. The answer of a "stated" problem is in the question.
# Each template returns (its name, question, worked steps, answer); a record keeps the name as "template".
# A wording: (question, worked step), formatted with the problem's name, item and numbers.
_STATED = {
    "stated": (
        "{name} puts {count} {item} in a box. How many {item} are in the box?",
        "There are {count} {item} in the box.",
    ),
    "stated_reworded": (
        "There are {count} {item} on {name}'s desk. How many {item} lie on the desk?",
        "There are {count} {item} on the desk.",
    ),
}
_MORE = {
    "more": (
        "{name} has {have} {item} and finds {more} more. How many {item} does {name} have now?",
        "{name} has {have}+{more} = <<{have}+{more}={total}>>{total} {item}.",
    ),
    "more_reworded": (
        "{name} had {have} {item}. A friend gave {name} {more} {item}. How many {item} does {name} have in all?",
        "{name} has {have}+{more} = <<{have}+{more}={total}>>{total} {item}.",
    ),
}
_LEFT = {
    "left": (
        "{name} has {have} {item} and gives {given} away. How many {item} are left?",
        "{name} has {have}-{given} = <<{have}-{given}={left}>>{left} {item} left.",
    ),
    "left_reworded": (
        "{name} had {have} {item} and lost {given} of them. How many {item} does {name} still have?",
        "{name} has {have}-{given} = <<{have}-{given}={left}>>{left} {item}.",
    ),
}


def _easy_stated(template: str, rng: random.Random) -> tuple[str, str, list[str], int]:
    name, item, count = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(1, 9)
    question, step = _STATED[template]
    return template, question.format(name=name, item=item, count=count), [step.format(count=count, item=item)], count


def _easy_more(template: str, rng: random.Random, low: int = 1, high: int = 9) -> tuple[str, str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    have, more = rng.randint(low, high), rng.randint(low, high)
    question, step = _MORE[template]
    figures = {"name": name, "item": item, "have": have, "more": more, "total": have + more}
    return template, question.format(**figures), [step.format(**figures)], have + more


def _easy_left(template: str, rng: random.Random, low: int = 1, high: int = 9) -> tuple[str, str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    have = rng.randint(low + 1, high)
    given = rng.randint(low, have - 1)
    question, step = _LEFT[template]
    figures = {"name": name, "item": item, "have": have, "given": given, "left": have - given}
    return template, question.format(**figures), [step.format(**figures)], have - given


# (name, question about {name} and {item}, the fact that answers it, the answer)
_FACTS = [
    ("dozen", "{name} buys a dozen {item}. How many {item} does {name} buy?", "A dozen is 12.", 12),
    ("week", "{name} visits a friend for a week. How many days is the visit?", "A week has 7 days.", 7),
    ("pair", "{name} finds a pair of {item}. How many {item} does {name} find?", "A pair is 2.", 2),
    ("triangle", "{name} draws a triangle. How many sides does the triangle have?", "A triangle has 3 sides.", 3),
    ("spider", "{name} sees a spider. How many legs does the spider have?", "A spider has 8 legs.", 8),
    (
        "half_hour",
        "{name} reads for half an hour. How many minutes does {name} read?",
        "Half an hour is 30 minutes.",
        30,
    ),
]
# The same six facts asked in other words.
_FACTS_REWORDED = [
    ("dozen_reworded", "{name} orders a dozen {item}. How many {item} arrive?", "A dozen is 12.", 12),
    (
        "week_reworded",
        "{name} trains every day for one week. How many days does {name} train?",
        "A week has 7 days.",
        7,
    ),
    ("pair_reworded", "{name} gets a pair of {item} as a gift. How many {item} is that?", "A pair is 2.", 2),
    (
        "triangle_reworded",
        "{name} cuts a triangle out of paper. How many sides does it have?",
        "A triangle has 3 sides.",
        3,
    ),
    ("spider_reworded", "A spider walks past {name}. How many legs does it walk on?", "A spider has 8 legs.", 8),
    (
        "half_hour_reworded",
        "{name} waits half an hour for the bus. How many minutes is the wait?",
        "Half an hour is 30 minutes.",
        30,
    ),
]


def _easy_fact(facts: list[tuple[str, str, str, int]], rng: random.Random) -> tuple[str, str, list[str], int]:
    template, question, fact, answer = rng.choice(facts)
    return template, question.format(name=rng.choice(NAMES), item=rng.choice(ITEMS)), [fact], answer


# The templates of the training split (and of the local base models' fine-tuning, format_tuned_models):
# "seen". Half the facts, then a number stated, added, taken away.
EASY_GSM8K_TEMPLATES: list[Callable[[random.Random], tuple[str, str, list[str], int]]] = [
    *[functools.partial(_easy_fact, _FACTS)] * 3,
    functools.partial(_easy_stated, "stated"),
    functools.partial(_easy_more, "more"),
    functools.partial(_easy_left, "left"),
]
# "Unseen" templates: never in a training split. Each asks for a skill of a seen template, in words the
# seen ones do not use: the same six facts asked another way, a count stated with another verb and place,
# an addition without "finds ... more", a subtraction without "gives ... away ... left". A model that
# learned the skill, not the wording, can solve them: a gain on them is transfer, not recall.
UNSEEN_EASY_GSM8K_TEMPLATES: list[Callable[[random.Random], tuple[str, str, list[str], int]]] = [
    *[functools.partial(_easy_fact, _FACTS_REWORDED)] * 3,
    functools.partial(_easy_stated, "stated_reworded"),
    functools.partial(_easy_more, "more_reworded"),
    functools.partial(_easy_left, "left_reworded"),
]


def _records(templates, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        question, steps, result = rng.choice(templates)(rng)
        records.append({"question": question, "answer": "\n".join(steps) + f"\n#### {result}"})
    return records


def _named_records(templates, seed: int) -> Iterator[dict]:
    """Endless records of templates that name themselves, each with its ``template``."""
    rng = random.Random(seed)
    while True:
        template, question, steps, result = rng.choice(templates)(rng)
        yield {"question": question, "answer": "\n".join(steps) + f"\n#### {result}", "template": template}


def _records_in_turn(templates, seed: int) -> Iterator[dict]:
    """Endless records like ``_named_records``, taking the templates in turn rather than at random."""
    rng = random.Random(seed)
    for make in itertools.cycle(templates):
        template, question, steps, result = make(rng)
        yield {"question": question, "answer": "\n".join(steps) + f"\n#### {result}", "template": template}


def gsm8k_records(n: int, seed: int = 0) -> list[dict]:
    """``n`` worded GSM8K-format records: a question and a worked answer ending in ``#### <number>``."""
    return _records(GSM8K_TEMPLATES, n, seed)


def gsm8k_easy_records(n: int, seed: int = 0) -> list[dict]:
    """``n`` easy GSM8K-format records (one step, numbers below 10) of the seen templates, the offline
    GSM8K set's training problems; each names its ``template``."""
    return list(itertools.islice(_named_records(EASY_GSM8K_TEMPLATES, seed), n))


UNSEEN_SEED_OFFSET = 1_000_003  # the unseen problems' own random stream, apart from the seen ones'


def gsm8k_easy_split(n_train: int, n_test: int, seed: int = 0) -> dict[str, list[dict]]:
    """The offline GSM8K set's splits. ``train``: ``gsm8k_easy_records(n_train, seed)``, seen templates only.
    ``test``: alternately a seen-template problem whose question is not in ``train`` (``"split": "seen"``)
    and a problem of an unseen template (``"split": "unseen"``), so that any even prefix is half and half."""
    return _seen_unseen_split(EASY_GSM8K_TEMPLATES, UNSEEN_EASY_GSM8K_TEMPLATES, n_train, n_test, seed)


def _seen_unseen_split(seen_templates, unseen_templates, n_train: int, n_test: int, seed: int) -> dict[str, list[dict]]:
    seen = _named_records(seen_templates, seed)
    train = list(itertools.islice(seen, n_train))
    trained = {r["question"] for r in train}
    # Each half takes its templates in turn, so the held-out problems have the training split's mix of
    # skills however few they are: drawn at random, 16 seen problems of the easy set (half facts, a sixth
    # each stated, added, taken away) once held 14 facts, and a gain on them said nothing of the sums.
    new_seen = (r for r in _records_in_turn(seen_templates, seed) if r["question"] not in trained)
    unseen = _records_in_turn(unseen_templates, seed + UNSEEN_SEED_OFFSET)
    test = [
        {**next(new_seen), "split": "seen"} if i % 2 == 0 else {**next(unseen), "split": "unseen"}
        for i in range(n_test)
    ]
    return {"train": train, "test": test}


# The offline "arithmetic" set: the easy set's sums and differences with three-digit numbers, in the same
# wordings (seen: "more", "left"; unseen: their rewordings). One step, but one a 135M model gets wrong in
# its head and a Python tool gets right: the set on which notebook 15 shows what the tool is worth.
THREE_DIGITS = {"low": 100, "high": 999}
ARITHMETIC_TEMPLATES = [
    functools.partial(_easy_more, "more", **THREE_DIGITS),
    functools.partial(_easy_left, "left", **THREE_DIGITS),
]
UNSEEN_ARITHMETIC_TEMPLATES = [
    functools.partial(_easy_more, "more_reworded", **THREE_DIGITS),
    functools.partial(_easy_left, "left_reworded", **THREE_DIGITS),
]


def arithmetic_split(n_train: int, n_test: int, seed: int = 0) -> dict[str, list[dict]]:
    """The offline arithmetic set's splits (GSM8K's format, a ``template`` per record), halved as
    ``gsm8k_easy_split`` halves the easy set: ``train`` of the seen templates, ``test`` alternately seen
    (a question not in ``train``) and unseen."""
    return _seen_unseen_split(ARITHMETIC_TEMPLATES, UNSEEN_ARITHMETIC_TEMPLATES, n_train, n_test, seed)


def arithmetic_records(n: int, seed: int = 0) -> list[dict]:
    """``n`` records of the arithmetic set's seen templates (its training split's problems)."""
    return list(itertools.islice(_named_records(ARITHMETIC_TEMPLATES, seed), n))


def gsm8k_final_number(answer: str) -> str:
    """The reference number of a GSM8K answer (the text after ``####``)."""
    return answer.split("####")[-1].strip().replace(",", "")


def solution_text(answer: str) -> str:
    """A GSM8K answer without the ``<<...>>`` calculator annotations, as a model should write it."""
    import re

    return re.sub(r"<<[^>]*>>", "", answer)


# --------------------------------------------------------------------------- preferences, chat


def preference_records(n: int, seed: int = 0) -> list[dict]:
    """Preference pairs on the worded problems: the chosen answer is the worked solution ending with the
    ``#### <number>`` line the GSM8K checker reads first (and ``format_reward`` pays for); the rejected one has
    the same steps but ends without that line, in one of two ways, alternately:

    - it stops after the last step (``unfinished_answer``);
    - it ends "The answer is <number>." instead (``worded_answer``).

    Why these: the base models prefer the rejected answer or cannot tell the two apart, so DPO has something
    to teach, and what it teaches (end with the line the checker reads; the prompt, the bare question, does
    not ask for it) is one rule that a few steps can learn and that carries over to held-out pairs. Measured
    with summed answer log-probabilities (tokenised by ``common.preferences.tokenize_pair``) on the 96 pairs
    of seed 0, the share where the base model gives the chosen answer the higher log-probability, and the
    median margin chosen - rejected: SmolLM2-135M-Instruct 0.04 (-4.3 nats) on the unfinished kind and 0.38
    (-1.1) on the worded kind; the tiny model 0.00 (-28) and 1.00 (+20): being untrained, it prefers the
    answer of fewer tokens, so 0.5 over the mix. A rejected answer that keeps the steps and ends with a wrong
    ``#### <number>`` teaches nothing: SmolLM2 gives the right number the higher log-probability in 48 of
    48 such pairs (it copies the last step's result), and in 0.90 when the slip is carried into the last step.
    """
    records = []
    for i, problem in enumerate(gsm8k_records(n, seed=seed + 1)):
        chosen = solution_text(problem["answer"])
        rejected = unfinished_answer(chosen) if i % 2 == 0 else worded_answer(chosen)
        records.append({"prompt": problem["question"], "chosen": chosen, "rejected": rejected})
    return records


def _steps(solution: str) -> str:
    """A worked solution without its final ``#### <number>`` line."""
    return solution.rsplit("####", 1)[0].rstrip()


def unfinished_answer(solution: str) -> str:
    """The worked steps, stopped after the last one: no final line."""
    return _steps(solution)


def worded_answer(solution: str) -> str:
    """The worked steps, then "The answer is <number>." instead of the ``#### <number>`` line."""
    return f"{_steps(solution)}\nThe answer is {gsm8k_final_number(solution)}."


_SMALL_TALK = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Name a prime number larger than 10.", "13 is a prime number larger than 10."),
    ("How many days are in a week?", "There are 7 days in a week."),
    ("What colour do you get by mixing blue and yellow?", "Mixing blue and yellow gives green."),
    ("Say hello in Spanish.", "Hola!"),
    ("What is 12 times 12?", "12 times 12 is 144."),
]


def _worded_chat_records(n: int, seed: int) -> list[dict]:
    """Worded maths and small talk (the text the tiny tokenizer was trained on)."""
    rng = random.Random(seed + 2)
    problems = gsm8k_records(n, seed=seed + 2)
    records = []
    for i in range(n):
        if i % 4 == 3:
            user, assistant = rng.choice(_SMALL_TALK)
            records.append(_small_talk(user, assistant))
        else:
            records.append(
                _answered(GSM8KEnvironment().prompt_messages(problems[i]), solution_text(problems[i]["answer"]))
            )
    return records


def _answered(messages: list[dict], assistant: str) -> dict:
    """A conversation: ``messages`` (as an environment asks, or one user turn) and the answer."""
    return {"messages": messages + [{"role": "assistant", "content": assistant}]}


def _small_talk(user: str, assistant: str) -> dict:
    return _answered([{"role": "user", "content": user}], assistant)


def chat_records(n: int, seed: int = 0) -> list[dict]:
    """SFT conversations in the ``messages`` format, asked as the RL environments ask: in every 8,
    4 easy maths problems and 1 worded one answered with ``#### <number>``, 2 code problems
    answered with one fenced program that passes their tests, 1 small talk."""
    easy = iter(gsm8k_easy_records(n, seed=seed + 4))
    code = iter(code_problem_records(n, seed=seed + 5))
    worded = iter(_worded_chat_records(n, seed))
    records = []
    for i in range(n):
        kind = i % 8
        if kind in (0, 2, 4, 6):
            problem = next(easy)
            records.append(_answered(GSM8KEnvironment().prompt_messages(problem), solution_text(problem["answer"])))
        elif kind in (1, 5):
            problem = next(code)
            records.append(_answered(CodeEnvironment().prompt_messages(problem), code_solution(problem)))
        elif kind == 3:
            records.append(next(r for r in worded if r["messages"][0]["role"] == "system"))
        else:
            user, assistant = _SMALL_TALK[(i // 8) % len(_SMALL_TALK)]
            records.append(_small_talk(user, assistant))
    return records


# --------------------------------------------------------------------------- competitive programming


def _code_sum_two(rng: random.Random, idx: int) -> dict:
    tests = []
    for _ in range(4):
        a, b = rng.randint(-1000, 1000), rng.randint(-1000, 1000)
        tests.append({"input": f"{a} {b}\n", "output": f"{a + b}\n"})
    return {
        "id": f"sum-two-{idx}",
        "testtype": "stdin",
        "statement": "Read two integers a and b from one line of standard input and print a + b.",
        "tests": tests,
    }


def _code_max_list(rng: random.Random, idx: int) -> dict:
    tests = []
    for _ in range(4):
        values = [rng.randint(-100, 100) for _ in range(rng.randint(1, 8))]
        tests.append({"input": f"{len(values)}\n{' '.join(map(str, values))}\n", "output": f"{max(values)}\n"})
    return {
        "id": f"max-list-{idx}",
        "testtype": "stdin",
        "statement": "The first line holds n, the second n integers. Print the largest of them.",
        "tests": tests,
    }


def _code_reverse(rng: random.Random, idx: int) -> dict:
    tests = []
    for _ in range(4):
        word = "".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 10)))
        tests.append({"input": word + "\n", "output": word[::-1] + "\n"})
    return {
        "id": f"reverse-{idx}",
        "testtype": "stdin",
        "statement": "Read one word and print it reversed.",
        "tests": tests,
    }


def _code_average(rng: random.Random, idx: int) -> dict:
    tests = []
    for _ in range(4):
        values = [rng.randint(0, 50) for _ in range(rng.randint(1, 6))]
        tests.append({"input": " ".join(map(str, values)) + "\n", "output": f"{sum(values) / len(values):.6f}\n"})
    return {
        "id": f"average-{idx}",
        "testtype": "stdin",
        "float_tolerance": True,
        "statement": "Read integers from one line and print their mean (an absolute or relative error "
        "of 1e-6 is accepted).",
        "tests": tests,
    }


def _code_add_function(rng: random.Random, idx: int) -> dict:
    tests = []
    for _ in range(4):
        a, b = rng.randint(-50, 50), rng.randint(-50, 50)
        tests.append({"input": json.dumps([a, b]), "output": json.dumps(a * b + a)})
    return {
        "id": f"func-{idx}",
        "testtype": "functional",
        "fn_name": "solve",
        "statement": "Write a function solve(a, b) that returns a * b + a.",
        "tests": tests,
    }


CODE_TEMPLATES = [_code_sum_two, _code_max_list, _code_reverse, _code_average, _code_add_function]

# A short correct program per template (the part of the id before its number).
_CODE_SOLUTIONS = {
    "sum-two": "a, b = map(int, input().split())\nprint(a + b)",
    "max-list": "input()\nprint(max(map(int, input().split())))",
    "reverse": "print(input()[::-1])",
    "average": "v = list(map(int, input().split()))\nprint(sum(v) / len(v))",
    "func": "def solve(a, b):\n    return a * b + a",
}


def code_solution(problem: dict) -> str:
    """A correct answer to one of the project's code problems, as one fenced Python block."""
    return f"```python\n{_CODE_SOLUTIONS[problem['id'].rsplit('-', 1)[0]]}\n```"


def code_problem_records(n: int, seed: int = 0) -> list[dict]:
    """Competitive-programming problems with stdin/stdout or functional tests."""
    rng = random.Random(seed + 3)
    return [CODE_TEMPLATES[i % len(CODE_TEMPLATES)](rng, i) for i in range(n)]


# --------------------------------------------------------------------------- functions to complete (HumanEval's form)


def _ints(rng, n=(1, 6), low=-20, high=20):
    return [rng.randint(low, high) for _ in range(rng.randint(*n))]


def _word(rng, letters="abcdeiou", n=(1, 8)):
    return "".join(rng.choice(letters) for _ in range(rng.randint(*n)))


def _palindrome_or_not(rng):
    word = _word(rng, "ab")
    return word + word[::-1] if rng.random() < 0.5 else word


# Each kind: name, parameters, return type, docstring and canonical body ({k} and {letter} are the problem's
# constant), and the maker of one test's arguments. The body is the reference: the tests' expected values
# are what it returns.
# fmt: off
_FUNCTION_KINDS = [
    ("add_k", "x: int", "int", "Return x plus {k}.", "return x + {k}", lambda r: [r.randint(-50, 50)]),
    ("times_k", "x: int", "int", "Return x multiplied by {k}.", "return x * {k}", lambda r: [r.randint(-20, 20)]),
    ("is_multiple_of_k", "n: int", "bool", "Return True if n is divisible by {k}, else False.",
     "return n % {k} == 0", lambda r: [r.randint(0, 60)]),
    ("largest", "values: list[int]", "int", "Return the largest number in the non-empty list values.",
     "return max(values)", lambda r: [_ints(r)]),
    ("smallest", "values: list[int]", "int", "Return the smallest number in the non-empty list values.",
     "return min(values)", lambda r: [_ints(r)]),
    ("total", "values: list[int]", "int", "Return the sum of the numbers in values.", "return sum(values)",
     lambda r: [_ints(r, (0, 6))]),
    ("count_above_k", "values: list[int]", "int", "Return how many numbers in values are greater than {k}.",
     "return sum(1 for v in values if v > {k})", lambda r: [_ints(r, (0, 8))]),
    ("keep_above_k", "values: list[int]", "list[int]",
     "Return the numbers in values that are greater than {k}, in their order.",
     "return [v for v in values if v > {k}]", lambda r: [_ints(r, (0, 8))]),
    ("add_k_to_each", "values: list[int]", "list[int]", "Return a new list with {k} added to every number.",
     "return [v + {k} for v in values]", lambda r: [_ints(r, (0, 6))]),
    ("reverse_text", "text: str", "str", "Return text reversed.", "return text[::-1]", lambda r: [_word(r)]),
    ("repeat_k_times", "text: str", "str", "Return text repeated {k} times.", "return text * {k}",
     lambda r: [_word(r, n=(1, 4))]),
    ("count_letter", "text: str, letter: str", "int", "Return how many times letter occurs in text.",
     "return text.count(letter)", lambda r: [_word(r, "abc", (0, 10)), r.choice("abc")]),
    ("shout", "text: str", "str", "Return text in upper case.", "return text.upper()", lambda r: [_word(r)]),
    ("word_count", "sentence: str", "int", "Return the number of words in sentence (words are separated by spaces).",
     "return len(sentence.split())", lambda r: [" ".join(_word(r) for _ in range(r.randint(1, 6)))]),
    ("first_k", "values: list[int]", "list[int]", "Return the first {k} numbers of values (all of them if fewer).",
     "return values[:{k}]", lambda r: [_ints(r, (0, 12))]),
    ("is_palindrome", "text: str", "bool", "Return True if text reads the same backwards, else False.",
     "return text == text[::-1]", lambda r: [_palindrome_or_not(r)]),
    ("absolute_difference", "a: int, b: int", "int", "Return the absolute difference between a and b.",
     "return abs(a - b)", lambda r: [r.randint(-30, 30), r.randint(-30, 30)]),
    ("max_of_two_plus_k", "a: int, b: int", "int", "Return the larger of a and b, plus {k}.",
     "return max(a, b) + {k}", lambda r: [r.randint(-30, 30), r.randint(-30, 30)]),
    ("square_each", "values: list[int]", "list[int]", "Return a new list with every number squared.",
     "return [v * v for v in values]", lambda r: [_ints(r, (0, 6), -9, 9)]),
    ("starts_with_letter", "text: str", "bool", "Return True if text starts with the letter '{letter}', else False.",
     "return text.startswith('{letter}')", lambda r: [_word(r, "abc")]),
]
# fmt: on


def _function_problem(rng: random.Random, idx: int, kind: tuple) -> dict:
    name, params, returns, doc, body, make_args = kind
    k = rng.randint(2, 9)
    constants = {"k": k, "letter": "abc"[k % 3]}
    canonical = f"    {body.format(**constants)}\n"
    reference: dict = {}
    exec(f"def {name}({params}):\n{canonical}", reference)  # the project's own reference body, not a model's
    calls = [make_args(rng) for _ in range(5)]
    tests = [{"input": json.dumps(args), "output": json.dumps(reference[name](*args))} for args in calls]
    described = doc.format(**constants)
    example = f"{name}({', '.join(repr(a) for a in calls[0])})"
    return {
        "id": f"function-{name}-{idx}",
        "testtype": "functional",
        "fn_name": name,
        "statement": f"Complete the function `{name}`: {described}",
        "starter_code": f'def {name}({params}) -> {returns}:\n    """{described}\n    >>> {example}\n'
        f'    {reference[name](*calls[0])!r}\n    """\n',
        "canonical_solution": canonical,
        "tests": tests,
    }


def function_problem_records(n: int, seed: int = 0) -> list[dict]:
    """Functions to complete, as HumanEval poses them: a signature and a docstring with one example,
    judged by calling the function on five argument lists and comparing what it returns. Twenty kinds
    (list, string and number functions a small instruct model sometimes writes right), each problem with
    its own constant; ``canonical_solution`` is the body that completes ``starter_code`` (HumanEval's
    field names)."""
    rng = random.Random(seed + 7)
    return [_function_problem(rng, i, _FUNCTION_KINDS[i % len(_FUNCTION_KINDS)]) for i in range(n)]


# --------------------------------------------------------------------------- writing


def write_jsonl(path: str | Path, records: Iterable[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def count_problem_records(n: int, seed: int = 0, largest: int = 5) -> list[dict]:
    """The easiest GSM8K-format problems: the answer is the number in the question. Small enough for
    the tiny model to learn in a few steps offline; the cloud runs use openai/gsm8k. One template, "count"."""
    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        name, item, count = rng.choice(NAMES), rng.choice(ITEMS), rng.randint(1, largest)
        question = f"{name} has {count} {item}. How many {item} does {name} have?"
        problems.append({"question": question, "answer": f"#### {count}", "template": "count"})
    return problems


# The count problems' "unseen" templates: the same skill (the answer is the number stated) in words the
# "count" template never uses, another verb and a place. Never trained on.
_COUNT_REWORDED = [
    ("count_desk", "There are {count} {item} on {name}'s desk. How many {item} lie on the desk?"),
    ("count_jar", "{name} counts {count} {item} in a jar. How many {item} are in the jar?"),
]


def count_problem_split(n_train: int, n_test: int, seed: int = 0, largest: int = 5) -> dict[str, list[dict]]:
    """``count_problem_records`` as ``gsm8k_easy_split`` splits the offline GSM8K set: ``train`` of the "count"
    template; ``test`` alternately a "count" problem whose question is not in ``train`` ("seen") and one of
    ``_COUNT_REWORDED`` ("unseen")."""
    train = count_problem_records(n_train, seed, largest)
    trained = {r["question"] for r in train}
    others = count_problem_records(n_train + 64 * n_test, seed + UNSEEN_SEED_OFFSET, largest)  # far more than enough
    new_seen = (r for r in others if r["question"] not in trained)
    rng = random.Random(seed + 2 * UNSEEN_SEED_OFFSET)

    def unseen() -> dict:
        template, question = rng.choice(_COUNT_REWORDED)
        count = rng.randint(1, largest)
        asked = question.format(name=rng.choice(NAMES), item=rng.choice(ITEMS), count=count)
        return {"question": asked, "answer": f"#### {count}", "template": template}

    test = [
        {**next(new_seen), "split": "seen"} if i % 2 == 0 else {**unseen(), "split": "unseen"} for i in range(n_test)
    ]
    return {"train": train, "test": test}


def read_jsonl(path: str | Path) -> list[dict]:
    with Path(path).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


DATASETS = {
    "gsm8k": gsm8k_easy_records,
    "preferences": preference_records,
    "chat": chat_records,
    "code": code_problem_records,
    "functions": function_problem_records,
    "arithmetic": arithmetic_records,
}


# The sets whose test split is half problems of the training templates, half of unseen ones.
HALVED_SPLITS = {"gsm8k": gsm8k_easy_split, "arithmetic": arithmetic_split}


def split_records(name: str, n_train: int, n_test: int, seed: int = 0) -> dict[str, list[dict]]:
    """Data set ``name``'s ``train`` and ``test`` records: for the sets of ``HALVED_SPLITS``, their own
    split (a test split half of seen templates, half of unseen ones); for the others, the first
    ``n_train`` records and the ``n_test`` after them."""
    if name in HALVED_SPLITS:
        return HALVED_SPLITS[name](n_train, n_test, seed)
    records = DATASETS[name](n_train + n_test, seed=seed)
    return {"train": records[:n_train], "test": records[n_train:]}


def write_all(root: str | Path, n_train: int = 64, n_test: int = 16, seed: int = 0) -> dict[str, Path]:
    """Write every data set as ``<root>/<name>/{train,test}.jsonl`` (``split_records``); returns the folder of each."""
    root = Path(root)
    folders = {}
    for name in DATASETS:
        for split, records in split_records(name, n_train, n_test, seed).items():
            write_jsonl(root / name / f"{split}.jsonl", records)
        folders[name] = root / name
    return folders


def corpus(seed: int = 0) -> list[str]:
    """Text for training the tiny tokenizer: every kind of text the offline data sets contain."""
    texts = [SYSTEM_PROMPT]
    texts += [r["question"] + "\n" + solution_text(r["answer"]) for r in gsm8k_records(400, seed)]
    texts += [m["content"] for r in _worded_chat_records(80, seed) for m in r["messages"]]
    texts += [
        p["statement"] + "\n" + t["input"] + t["output"] for p in code_problem_records(40, seed) for t in p["tests"]
    ]
    texts += [
        "```python\nimport sys\n\ndef main():\n    data = sys.stdin.read().split()\n"
        "    print(sum(int(x) for x in data))\n\nif __name__ == '__main__':\n    main()\n```",
        "def solve(a, b):\n    return a * b + a\n",
        "<think>\nLet me work it out step by step.\n</think>\n\\boxed{42} The answer is $1,000.00 or -3 or 3/4.",
    ]
    return texts
