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

``PairwiseJudge`` compares two answers to one question, in a random order per pair (a judge tends to
prefer the answer it reads first), and ``win_rate`` turns its verdicts into a rate with a standard error.
A judge too small to write JSON can still choose: given the token ids of "1" and "2" in its tokenizer
(``choice_token_ids``), the pairwise judge asks for one token with ``logit_bias`` on those two, so every
answer it can give is a verdict (no ties, no reason). A server that ignores ``logit_bias`` still fails
to parse, and is counted as such.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from common.llm_client import LLMClient, ParseError, json_object

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
    """Which of two answers to a question is better, each pair shown in a random order (seeded).

    ``choice_token_ids``: the judge tokenizer's ids of "1" and "2" (``{"1": id, "2": id}``). With them the
    judge answers with one token, constrained to those two by ``logit_bias``; without them it writes the
    JSON object of ``PAIRWISE_INSTRUCTIONS`` (which also allows a tie)."""

    def __init__(
        self,
        client: LLMClient,
        rubric: str = RUBRIC,
        seed: int = 0,
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
        self.seed = seed
        self.max_tokens = max_tokens
        self.choice_token_ids = choice_token_ids

    def request_parameters(self) -> tuple[str, object, dict]:
        """The instructions, the parser and the chat-completion parameters of one comparison."""
        if self.choice_token_ids is None:
            return PAIRWISE_INSTRUCTIONS, parse_preference, {"max_tokens": self.max_tokens}
        bias = {str(token_id): CHOICE_BIAS for token_id in self.choice_token_ids.values()}
        return CHOICE_INSTRUCTIONS, parse_choice, {"max_tokens": 1, "temperature": 0.0, "logit_bias": bias}

    def compare(self, questions: Sequence[str], answers_a: Sequence[str], answers_b: Sequence[str]) -> list[dict]:
        """One verdict per question: ``winner`` "a", "b", "tie", or None when the judge failed
        (``error`` then says why); ``a_first`` records the order the judge saw."""
        instructions, parse, params = self.request_parameters()
        order = random.Random(self.seed)
        requests, a_first = [], []
        for question, a, b in zip(questions, answers_a, answers_b, strict=True):
            first = order.random() < 0.5
            one, two = (a, b) if first else (b, a)
            a_first.append(first)
            requests.append(
                [
                    {"role": "system", "content": f"{self.rubric}\n{instructions}"},
                    {"role": "user", "content": f"Question:\n{question}\n\nAnswer 1:\n{one}\n\nAnswer 2:\n{two}"},
                ]
            )
        results = self.client.complete_structured_many(requests, parse, **params)
        verdicts = []
        for first, result in zip(a_first, results, strict=True):
            if not result.ok:
                verdicts.append({"winner": None, "a_first": first, "error": result.error})
                continue
            better = result.value["better"]
            winner = "tie" if better == 0 else ("a" if (better == 1) == first else "b")
            verdicts.append({"winner": winner, "a_first": first, "reason": result.value["reason"]})
        return verdicts


def win_rate(verdicts: Sequence[dict]) -> dict[str, float]:
    """A's win rate over the verdicts the judge gave (a tie counts one half), its standard error and a
    95 % confidence interval (normal approximation); failed verdicts are counted apart, not as losses.
    ``chose_first``: the share of decided verdicts that went to the answer the judge read first, its
    position bias (0.5 for a judge that reads; the random order keeps that bias out of the win rate,
    where it adds noise instead)."""
    outcomes = [{"a": 1.0, "b": 0.0, "tie": 0.5}[v["winner"]] for v in verdicts if v["winner"] is not None]
    decided = [v for v in verdicts if v["winner"] in ("a", "b") and "a_first" in v]
    n = len(outcomes)
    result = {
        "judged": float(n),
        "failed": float(len(verdicts) - n),
        "wins": float(outcomes.count(1.0)),
        "losses": float(outcomes.count(0.0)),
        "ties": float(outcomes.count(0.5)),
        "chose_first": (
            sum((v["winner"] == "a") == v["a_first"] for v in decided) / len(decided) if decided else math.nan
        ),
    }
    if n == 0:
        return {**result, "win_rate": math.nan, "standard_error": math.nan, "ci95_low": math.nan, "ci95_high": math.nan}
    rate = sum(outcomes) / n
    variance = sum((o - rate) ** 2 for o in outcomes) / (n - 1) if n > 1 else 0.0
    error = math.sqrt(variance / n)
    return {
        **result,
        "win_rate": rate,
        "standard_error": error,
        "ci95_low": max(0.0, rate - 1.96 * error),
        "ci95_high": min(1.0, rate + 1.96 * error),
    }


# A judge that gives this share of its decided verdicts (or 1 minus it) to the answer it read first is
# choosing by position: with the random order its rate is a coin toss per pair, not a comparison.
POSITION_BIAS_LIMIT = 0.9


def describe_win_rate(rate: dict, name_a: str = "A", name_b: str = "B") -> str:
    """``win_rate``'s result in one sentence, and a warning when the judge chose by position."""
    if not rate["judged"]:
        return f"{name_a} vs {name_b}: no win rate, since the judge gave no verdict ({rate['failed']:.0f} failed)"
    text = (
        f"{name_a} vs {name_b}: win rate {rate['win_rate']:.3f} ± {rate['standard_error']:.3f}, 95 % CI "
        f"[{rate['ci95_low']:.3f}, {rate['ci95_high']:.3f}]; {rate['judged']:.0f} judged, {rate['failed']:.0f} "
        f"failed; the judge chose the answer it read first in {rate['chose_first']:.0%} of its decided verdicts"
    )
    bias = rate["chose_first"]
    if not math.isnan(bias) and max(bias, 1 - bias) >= POSITION_BIAS_LIMIT:
        text += (
            ". That judge chose by position, not by the answers: this rate is the random order's, "
            "and says nothing about the two models"
        )
    return text
