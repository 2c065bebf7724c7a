"""An LLM judge: a model behind an OpenAI-compatible API grades each completion against a rubric.

The same environment protocol as the GSM8K checker and the code judge (``environments/__init__.py``),
so a loop uses it without knowing what it is. It asks the judge model (through
``common.llm_client.LLMClient``: cache, retries, budget, accounting) for one JSON object
``{"score": <integer 0-10>, "reason": "<one sentence>"}`` per completion; a strict parser checks it.

- **Alone** (``verifiable=None``): rows need a ``question``; the reward is ``score / 10``.
- **Mixed with a verifiable reward** (``verifiable="gsm8k"``): the rows, prompts, ``correct`` and
  ``format_reward`` are the verifiable environment's, and the reward is
  ``verifiable_weight x its reward + judge_weight x score / 10``.

**A judge failure is not a score.** When the judge's answer cannot be parsed, or its request failed
after its retries, the sample's reward is NaN and its score says ``judge_failed: True`` with the reason.
``common.advantages.group_advantages_excluding`` leaves such a sample out of its group's baseline and
gives it an advantage of 0; a loop that does not exclude it fails loudly on the NaN (``group_advantages``
refuses non-finite rewards) rather than training on a 0 it never earned. ``step_metrics`` reports the
failures of each step with the client's requests, cache hits, retries and tokens.

``PairwiseJudge`` compares two answers to one question **in both orders**: a judge tends to prefer the
answer it reads first, so a verdict counts only when the same answer wins with either one read first;
when the choice follows the position instead, the pair has no verdict ("position"). The judge is judged
before its verdicts are read (``judge_quality``): its position bias, and how often its surviving verdicts
agree with a checker on pairs where exactly one answer is right (``reference_pairs`` builds such pairs
from GSM8K's reference solutions). ``win_rate`` counts wins, losses and pairs without a verdict, with a
standard error, and ``describe_win_rate`` says in words what the rate is worth: nothing, when the judge
does not beat a coin on the checker's pairs or chooses by position.
A judge too small to write JSON can still choose: given the token ids of "1" and "2" in its tokenizer
(``choice_token_ids``), the pairwise judge asks for one token with ``logit_bias`` on those two, so every
answer it can give is a choice (no ties, no reason). A server that ignores ``logit_bias`` still fails
to parse, and is counted as such.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from common.llm_client import LLMClient, ParseError, json_object
from common.stats import GAIN_STANDARD_ERRORS, mean_and_standard_error

MAX_SCORE = 10
RUBRIC = (
    "You grade answers to maths word problems. Give 10 when the reasoning is correct and the final "
    "answer is right and stated as '#### <number>', 5 when the answer is right but the reasoning is "
    "muddled or the format is wrong, and 0 when the answer is wrong or missing."
)
VERDICT_INSTRUCTIONS = (
    'Reply with exactly one JSON object and nothing else: {"score": <integer from 0 to 10>, '
    '"reason": "<one sentence>"}.'
)
PAIRWISE_INSTRUCTIONS = (
    'Reply with exactly one JSON object and nothing else: {"better": <1 or 2, or 0 for a tie>, '
    '"reason": "<one sentence>"}.'
)
CHOICE_INSTRUCTIONS = "Reply with the number of the better answer and nothing else: 1 or 2."
# OpenAI's logit_bias runs from -100 to 100; at 100 the two choices outweigh every other token. A float:
# transformers serve refuses integer biases (its sequence_bias wants floats), which OpenAI accepts as well.
CHOICE_BIAS = 100.0
_verdict_object = json_object({"score": int, "reason": str})
_pairwise_object = json_object({"better": int, "reason": str})


def parse_verdict(text: str) -> dict:
    """The judge's verdict, strictly: the JSON object with an integer score from 0 to 10."""
    verdict = _verdict_object(text)
    if not 0 <= verdict["score"] <= MAX_SCORE:
        raise ParseError(f"score {verdict['score']} is outside 0..{MAX_SCORE}")
    return verdict


def parse_preference(text: str) -> dict:
    preference = _pairwise_object(text)
    if preference["better"] not in (0, 1, 2):
        raise ParseError(f"better is {preference['better']}, expected 1, 2 or 0")
    return preference


def parse_choice(text: str) -> dict:
    """A one-token verdict: "1" or "2" and nothing else (surrounding spaces allowed)."""
    choice = text.strip()
    if choice not in ("1", "2"):
        raise ParseError(f"expected the choice 1 or 2, got {text!r}")
    return {"better": int(choice), "reason": f"chose answer {choice}"}


class LLMJudgeEnvironment:
    """A rubric judge (see the module docstring). ``client`` is an ``LLMClient``; without one it is built
    from ``model`` and ``client_options`` (``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, cache, budget...)."""

    name = "llm_judge"

    def __init__(
        self,
        client: LLMClient | None = None,
        *,
        model: str | None = None,
        rubric: str = RUBRIC,
        verifiable: str | None = None,
        judge_weight: float = 1.0,
        verifiable_weight: float = 1.0,
        max_tokens: int = 96,
        **client_options,
    ):
        if client is None:
            if not model:
                raise ValueError("LLMJudgeEnvironment needs a client or the judge's model name (model=...).")
            client = LLMClient(model, **client_options)
        self.client = client
        self.rubric = rubric
        self.judge_weight = judge_weight
        self.verifiable_weight = verifiable_weight
        self.max_tokens = max_tokens
        self.verifiable = None
        if verifiable:
            from . import make_environment  # only when mixed

            self.verifiable = make_environment(verifiable)
        self._since_last = {"judged": 0, "judge_failed": 0, "score_sum": 0.0}
        self._usage_seen = dict(client.usage.as_dict())

    # ---- the protocol

    def load(self, path) -> list[dict]:
        if self.verifiable is not None:
            return self.verifiable.load(path)
        from common import data

        return data.read_jsonl(path, ["question"])

    def prompt_messages(self, example: dict) -> list[dict]:
        if self.verifiable is not None:
            return self.verifiable.prompt_messages(example)
        return [{"role": "user", "content": example["question"]}]

    def judge_messages(self, example: dict, completion: str) -> list[dict]:
        """What the judge reads: the rubric, then the question and the answer to grade."""
        return [
            {"role": "system", "content": f"{self.rubric}\n{VERDICT_INSTRUCTIONS}"},
            {"role": "user", "content": f"Question:\n{example['question']}\n\nAnswer to grade:\n{completion}"},
        ]

    def score(self, examples: list[dict], completions: list[str]) -> list[dict]:
        verdicts = self.client.complete_structured_many(
            [self.judge_messages(e, c) for e, c in zip(examples, completions, strict=True)],
            parse_verdict,
            max_tokens=self.max_tokens,
            temperature=0.0,
        )
        checked = self.verifiable.score(examples, completions) if self.verifiable is not None else None
        scores = []
        for index, verdict in enumerate(verdicts):
            score = dict(checked[index]) if checked is not None else {}
            self._since_last["judged"] += 1
            if verdict.ok:
                judge_reward = verdict.value["score"] / MAX_SCORE
                self._since_last["score_sum"] += judge_reward
                base = self.verifiable_weight * score["reward"] if checked is not None else 0.0
                score.update(
                    reward=base + self.judge_weight * judge_reward,
                    judge_reward=judge_reward,
                    judge_reason=verdict.value["reason"],
                    judge_failed=False,
                )
            else:
                self._since_last["judge_failed"] += 1
                score.update(reward=math.nan, judge_reward=None, judge_failed=True, judge_error=verdict.error)
            scores.append(score)
        return scores

    def step_metrics(self) -> dict[str, float]:
        """Judge failures and the client's work since the previous call (one GRPO step)."""
        since, usage = self._since_last, self.client.usage.as_dict()
        delta = {name: usage[name] - self._usage_seen[name] for name in usage}
        judged_ok = since["judged"] - since["judge_failed"]
        metrics = {
            "judge_failed": float(since["judge_failed"]),
            "judge_failure_rate": since["judge_failed"] / since["judged"] if since["judged"] else 0.0,
            "judge_score": since["score_sum"] / judged_ok if judged_ok else 0.0,
            "judge_requests": float(delta["requests"]),
            "judge_cached_hits": float(delta["cached_hits"]),
            "judge_retries": float(delta["retries"]),
            "judge_tokens": float(delta["total_tokens"]),
        }
        self._since_last = {"judged": 0, "judge_failed": 0, "score_sum": 0.0}
        self._usage_seen = usage
        return metrics


class PairwiseJudge:
    """Which of two answers to a question is better, each pair asked in both orders (see ``compare``).

    ``choice_token_ids``: the judge tokenizer's ids of "1" and "2" (``{"1": id, "2": id}``). With them the
    judge answers with one token, constrained to those two by ``logit_bias``; without them it writes the
    JSON object of ``PAIRWISE_INSTRUCTIONS`` (which also allows a tie)."""

    def __init__(
        self,
        client: LLMClient,
        rubric: str = RUBRIC,
        max_tokens: int = 96,
        choice_token_ids: dict[str, int] | None = None,
    ):
        if choice_token_ids is not None and set(choice_token_ids) != {"1", "2"}:
            raise ValueError(
                f"choice_token_ids maps {sorted(choice_token_ids)}; give the judge tokenizer's ids of exactly "
                '"1" and "2", for example {"1": 16, "2": 17}.'
            )
        self.client = client
        self.rubric = rubric
        self.max_tokens = max_tokens
        self.choice_token_ids = choice_token_ids

    def request_parameters(self) -> tuple[str, object, dict]:
        """The instructions, the parser and the chat-completion parameters of one comparison."""
        if self.choice_token_ids is None:
            return PAIRWISE_INSTRUCTIONS, parse_preference, {"max_tokens": self.max_tokens}
        bias = {str(token_id): CHOICE_BIAS for token_id in self.choice_token_ids.values()}
        return CHOICE_INSTRUCTIONS, parse_choice, {"max_tokens": 1, "temperature": 0.0, "logit_bias": bias}

    def messages(self, instructions: str, question: str, one: str, two: str) -> list[dict]:
        return [
            {"role": "system", "content": f"{self.rubric}\n{instructions}"},
            {"role": "user", "content": f"Question:\n{question}\n\nAnswer 1:\n{one}\n\nAnswer 2:\n{two}"},
        ]

    def compare(self, questions: Sequence[str], answers_a: Sequence[str], answers_b: Sequence[str]) -> list[dict]:
        """Every pair asked twice, A read first and B read first. One verdict per pair:

        - ``a_first`` and ``b_first``: the answer the judge chose in each order, "a", "b" or "tie" (None
          when that request failed);
        - ``outcome``: "a" or "b" when that answer won in both orders (the verdict survived the swap);
          "position" when the same position won both times (the choice followed the order, not the
          answers); "tie" when the judge called a tie in either order; "failed" when either request
          failed (``error`` says why)."""
        instructions, parse, params = self.request_parameters()
        pairs = list(zip(questions, answers_a, answers_b, strict=True))
        requests = [self.messages(instructions, q, a, b) for q, a, b in pairs]
        requests += [self.messages(instructions, q, b, a) for q, a, b in pairs]
        results = self.client.complete_structured_many(requests, parse, **params)
        verdicts = []
        for a_read_first, b_read_first in zip(results[: len(pairs)], results[len(pairs) :], strict=True):
            a_first, b_first = _chosen(a_read_first, "a", "b"), _chosen(b_read_first, "b", "a")
            verdict = {"outcome": _outcome(a_first, b_first), "a_first": a_first, "b_first": b_first}
            errors = [r.error for r in (a_read_first, b_read_first) if not r.ok]
            if errors:
                verdict["error"] = "; ".join(errors)
            verdicts.append(verdict)
        return verdicts


def _chosen(result, first: str, second: str) -> str | None:
    """The answer one order's reply chose: ``first`` for "1", ``second`` for "2", "tie" for 0."""
    return {0: "tie", 1: first, 2: second}[result.value["better"]] if result.ok else None


def _outcome(a_first: str | None, b_first: str | None) -> str:
    if a_first is None or b_first is None:
        return "failed"
    if "tie" in (a_first, b_first):
        return "tie"
    return a_first if a_first == b_first else "position"


def reference_pairs(env, problems: Sequence[dict], *model_answers: Sequence[str]) -> dict[str, list]:
    """Pairs where exactly one answer is right, to judge a judge by: each problem's reference solution
    (``problem["answer"]``, right by ``env``'s checker) as answer A, against the first of the models'
    answers to it (``model_answers``: one list per model) that the checker finds wrong as answer B. One pair
    a problem at most, so that the pairs are independent; a problem whose answers are all right gives none.
    Returns ``questions``, ``answers_a``, ``answers_b``, ``right`` (the right answer of each pair: "a") and
    ``problems`` (the index of each pair's problem)."""
    references = env.score(problems, [p["answer"] for p in problems])
    scores = [env.score(problems, answers) for answers in model_answers]
    pairs = {"questions": [], "answers_a": [], "answers_b": [], "right": [], "problems": []}
    for index, problem in enumerate(problems):
        wrong = [
            answers[index]
            for answers, scored in zip(model_answers, scores, strict=True)
            if not scored[index]["correct"]
        ]
        if references[index]["correct"] and wrong:
            pairs["questions"].append(problem["question"])
            pairs["answers_a"].append(problem["answer"])
            pairs["answers_b"].append(wrong[0])
            pairs["right"].append("a")
            pairs["problems"].append(index)
    return pairs


# ---------------------------------------------------------------------- what the verdicts are worth


def position_bias(verdicts: Sequence[dict]) -> dict[str, float]:
    """How much the order decided: of all the orders asked (two a pair, the pairs whose requests failed
    left out), the share in which the judge chose the answer it read first (``chose_first``) or second
    (``chose_second``; the rest are ties), and of the pairs with a choice in both orders, the share whose
    verdict flipped with the order (``flipped``). Standard errors over pairs: a pair's two orders are one
    pair's, not two independent draws. A judge that reads gives about 0.5 and 0."""
    answered = [v for v in verdicts if v["outcome"] != "failed"]
    decided = [v for v in answered if v["outcome"] != "tie"]
    result = {"orders": 2.0 * len(answered), "decided_pairs": float(len(decided))}
    for name, shares in (
        ("chose_first", [((v["a_first"] == "a") + (v["b_first"] == "b")) / 2 for v in answered]),
        ("chose_second", [((v["a_first"] == "b") + (v["b_first"] == "a")) / 2 for v in answered]),
        ("flipped", [float(v["outcome"] == "position") for v in decided]),
    ):
        share, error = mean_and_standard_error(shares) if shares else (math.nan, math.nan)
        result |= {name: share, f"{name}_standard_error": error}
    return result


def judge_quality(verdicts: Sequence[dict], right: Sequence[str | None]) -> dict[str, float]:
    """A judge judged on pairs whose right answer a checker knows (``right``: "a" or "b" for a pair where
    exactly one answer is right, None for the others): its ``position_bias``, how many pairs were
    ``judgeable`` and how many verdicts on them ``surviving`` the swap, the share of those that chose the
    right answer (``agreement``) with its standard error, and a coin's standard error for that many
    verdicts (``coin_standard_error``, sqrt(0.25 / n)): what a judge that guesses would scatter by."""
    judgeable = [(v, r) for v, r in zip(verdicts, right, strict=True) if r in ("a", "b")]
    agreed = [float(v["outcome"] == r) for v, r in judgeable if v["outcome"] in ("a", "b")]
    agreement, error = mean_and_standard_error(agreed) if agreed else (math.nan, math.nan)
    return {
        **position_bias(verdicts),
        "judgeable": float(len(judgeable)),
        "surviving": float(len(agreed)),
        "agreement": agreement,
        "agreement_standard_error": error,
        "coin_standard_error": 0.5 / math.sqrt(len(agreed)) if agreed else math.nan,
    }


def win_rate(verdicts: Sequence[dict]) -> dict[str, float]:
    """A's win rate over the pairs judged in both orders: a surviving verdict counts 1 (A) or 0 (B), a pair
    without one (``ties``: flipped with the order, or a tie) one half; failed pairs are counted apart, not
    as losses. With its standard error over pairs, and the ``position_bias`` of these verdicts."""
    judged = [v for v in verdicts if v["outcome"] != "failed"]
    outcomes = [{"a": 1.0, "b": 0.0}.get(v["outcome"], 0.5) for v in judged]
    rate, error = mean_and_standard_error(outcomes) if outcomes else (math.nan, math.nan)
    count = [v["outcome"] for v in judged].count
    return {
        "judged": float(len(judged)),
        "failed": float(len(verdicts) - len(judged)),
        "wins": float(count("a")),
        "losses": float(count("b")),
        "ties": float(count("position") + count("tie")),
        "no_verdict_position": float(count("position")),
        "no_verdict_tie": float(count("tie")),
        "win_rate": rate,
        "standard_error": error,
        **position_bias(verdicts),
    }


# A judge that gives this share of the orders it is asked to one position is choosing by position, not by
# the answers: its few surviving verdicts are the exceptions, not a comparison.
POSITION_BIAS_LIMIT = 0.9


def _by_position(figures: dict, pairs: str) -> str | None:
    for position in ("first", "second"):
        share = figures.get(f"chose_{position}", math.nan)
        if not math.isnan(share) and share >= POSITION_BIAS_LIMIT:
            return f"it chose the answer it read {position} in {share:.0%} of the {figures['orders']:.0f} orders of {pairs}"
    return None


def judge_too_weak(quality: dict, rate: dict | None = None) -> str | None:
    """Why the judge's verdicts say nothing, or None when they are worth reading. A judge is too weak when
    its agreement with the checker (``judge_quality``) is not beyond ``GAIN_STANDARD_ERRORS`` of a coin's
    standard errors above 0.5 (a coin's: the measured one is 0 when every verdict agreed), or when it chose
    one position in ``POSITION_BIAS_LIMIT`` of its orders, on the checker's pairs or on ``rate``'s."""
    checked, compared = _by_position(quality, "the checked pairs"), rate and _by_position(rate, "these pairs")
    if checked and compared and checked.split(" in ")[0] == compared.split(" in ")[0]:  # the same position
        checked, compared = f"{checked}, and in {compared.split(' in ', 1)[1]}", None
    reasons = [reason for reason in (checked, compared) if reason]
    if not quality["judgeable"]:
        reasons.append("no pair had exactly one right answer to check it on")
    elif not quality["surviving"]:
        reasons.append(f"none of its verdicts on the {quality['judgeable']:.0f} checked pairs survived the swap")
    elif quality["agreement"] - 0.5 <= GAIN_STANDARD_ERRORS * quality["coin_standard_error"]:
        reasons.append(
            f"it agreed with the checker on {quality['agreement']:.2f} ± {quality['agreement_standard_error']:.2f} of "
            f"its {quality['surviving']:.0f} surviving verdicts, not beyond {GAIN_STANDARD_ERRORS:g} standard "
            f"errors of a coin's 0.5 (± {quality['coin_standard_error']:.2f})"
        )
    return "; ".join(dict.fromkeys(reasons)) or None


def describe_judge(quality: dict) -> str:
    """``judge_quality`` in words: position bias, verdicts that survived the swap, agreement with the
    checker, and whether the judge is worth reading (``judge_too_weak``)."""
    text = (
        f"The judge on {quality['judgeable']:.0f} pairs where exactly one answer is right by the checker, each "
        f"asked in both orders: it chose the answer it read first in {quality['chose_first']:.2f} ± "
        f"{quality['chose_first_standard_error']:.2f} of {quality['orders']:.0f} orders, and its verdict flipped "
        f"with the order on {quality['flipped']:.2f} ± {quality['flipped_standard_error']:.2f} of "
        f"{quality['decided_pairs']:.0f} pairs. "
    )
    if quality["surviving"]:
        text += (
            f"{quality['surviving']:.0f} verdicts survived the swap; {quality['agreement']:.2f} ± "
            f"{quality['agreement_standard_error']:.2f} of them chose the right answer (a coin: 0.50 ± "
            f"{quality['coin_standard_error']:.2f}). "
        )
    weak = judge_too_weak(quality)
    if weak:
        return text + f"Too weak to judge: {weak}."
    return text + f"It judges better than a coin, beyond {GAIN_STANDARD_ERRORS:g} standard errors."


def describe_win_rate(rate: dict, quality: dict, name_a: str = "A", name_b: str = "B") -> str:
    """``win_rate``'s result in one sentence, read by ``judge_quality``: when the judge is too weak
    (``judge_too_weak``) the sentence says so and that the rate says nothing; otherwise whether A or B is
    judged better beyond ``GAIN_STANDARD_ERRORS`` standard errors of 0.5, or neither."""
    if not rate["judged"]:
        return f"{name_a} vs {name_b}: no win rate, since every comparison failed ({rate['failed']:.0f} pairs)"
    failed = f", {rate['failed']:.0f} failed" if rate["failed"] else ""
    text = (
        f"{name_a} vs {name_b}, each pair judged in both orders: {rate['wins']:.0f} wins, {rate['losses']:.0f} "
        f"losses, {rate['ties']:.0f} without a verdict that survived the swap ({rate['no_verdict_position']:.0f} "
        f"flipped with the order, {rate['no_verdict_tie']:.0f} ties){failed}; win rate {rate['win_rate']:.3f} ± "
        f"{rate['standard_error']:.3f} (no verdict counts one half)"
    )
    weak = judge_too_weak(quality, rate)
    if weak:
        return text + f". The judge is too weak to judge ({weak}): this win rate says nothing about the two models"
    margin = GAIN_STANDARD_ERRORS * rate["standard_error"]
    if rate["standard_error"] and rate["win_rate"] - 0.5 > margin:
        return text + f": {name_a} judged better, beyond {GAIN_STANDARD_ERRORS:g} standard errors"
    if rate["standard_error"] and 0.5 - rate["win_rate"] > margin:
        return text + f": {name_b} judged better, beyond {GAIN_STANDARD_ERRORS:g} standard errors"
    return text + f": within {GAIN_STANDARD_ERRORS:g} standard errors of 0.5, the judge does not tell them apart"
