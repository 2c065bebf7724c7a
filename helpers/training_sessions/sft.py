"""The SFT notebook's plumbing (07): conversations as datums, the held-out loss, sampled answers and their
format. The loop itself (datums, ``forward_backward``, ``optim_step``) is in the notebook."""

from __future__ import annotations

from common import stats
from common.data import prompt_token_ids  # scripts/common: helpers.training_sessions puts scripts/ on the path
from environments import taught_format

from helpers.training_sessions import datum_tools, grpo

# The tokens an answer may take: the least a session's sample request accepts (its maxTokens). The jobs'
# answers take at most 256 (``sft.py --answer_max_tokens``); the offline references take at most 42.
ANSWER_MAX_TOKENS = 512
FORMAT_MEASURE = "share of answers in the taught format"


def conversation_datum(tokenizer, messages: list[dict]):
    """Everything before the last assistant turn is the prompt (weight 0); that turn and its end of
    turn are the answer (weight 1)."""
    prompt = prompt_token_ids(tokenizer, messages[:-1])
    answer = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return datum_tools.supervised_datum(prompt, answer)


def held_out_loss(training_client, datums: list) -> dict:
    """Cross-entropy per answer token on conversations the loop does not train on, from ``forward``
    (no gradient, no update). The standard error is over conversations (each one's loss per token)."""
    outputs = training_client.forward(datums, loss_fn="cross_entropy").result().loss_fn_outputs
    per_conversation = [
        datum_tools.values(o["loss"])[0] / datum_tools.target_tokens([d]) for d, o in zip(datums, outputs, strict=True)
    ]
    loss, standard_error = stats.mean_and_standard_error(per_conversation)
    return {"loss": loss, "standard_error": standard_error, "conversations": len(datums)}


def sample_answers(
    sampling_client, tokenizer, prompts: list[list[dict]], max_tokens: int = ANSWER_MAX_TOKENS
) -> list[str]:
    """One greedy answer per prompt (chat messages), decoded."""
    from sagemaker.train.training_session import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = [
        sampling_client.sample(prompt_token_ids(tokenizer, messages), num_samples=1, sampling_params=params)
        for messages in prompts
    ]  # all in flight at once
    return [tokenizer.decode(f.result().sequences[0].tokens, skip_special_tokens=True) for f in futures]


def held_out_format(sampling_client, tokenizer, conversations: list[list[dict]]) -> dict:
    """Greedy answers to the held-out conversations whose reference answer (the last turn) teaches a format,
    checked for it (``environments.taught_format``, as ``sft.py`` checks its jobs'): the share in format with
    its standard error over conversations, and the answers' diversity."""
    taught = [m for m in conversations if taught_format.taught_format(m[-1]["content"]) is not None]
    answers = sample_answers(sampling_client, tokenizer, [m[:-1] for m in taught])
    return taught_format.format_evaluation([m[-1]["content"] for m in taught], answers)


def format_line(evaluation: dict) -> str:
    """'held-out answers in the taught format: 0.143 ± 0.067 of 28 (28 answers, 3 distinct; ...)'."""
    return (
        f"held-out answers in the taught format: {evaluation['share']:.3f} ± {evaluation['standard_error']:.3f} "
        f"of {evaluation['conversations']} ({stats.describe_answers(evaluation['answer_diversity'])})"
    )


def format_record(before: dict, after: dict) -> dict:
    """Two ``held_out_format`` results of the same conversations as the notebooks record a held-out change
    (``grpo.held_out_record``: each figure with its standard error, the paired change's, the answers' diversity)."""

    def as_held_out(evaluation: dict) -> dict:
        return {
            "accuracy": evaluation["share"],  # held_out_record's name for the figure
            "standard_error": evaluation["standard_error"],
            "problems": evaluation["conversations"],
            "samples_per_problem": 1,
            "per_problem": evaluation["per_conversation"],
            "answer_diversity": evaluation["answer_diversity"],
        }

    return grpo.held_out_record(as_held_out(before), as_held_out(after), measure=FORMAT_MEASURE)
