"""The SFT notebook's plumbing (07): conversations as datums, the held-out loss, sampled answers.
The loop itself (datums, ``forward_backward``, ``optim_step``) is in the notebook."""

from __future__ import annotations

from common import stats
from common.data import prompt_token_ids  # scripts/common: helpers.training_sessions puts scripts/ on the path

from helpers.training_sessions import datum_tools


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


def sample_answers(sampling_client, tokenizer, prompts: list[list[dict]], max_tokens: int = 512) -> list[str]:
    """One greedy answer per prompt (chat messages), decoded."""
    from sagemaker.train.training_session import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    futures = [
        sampling_client.sample(prompt_token_ids(tokenizer, messages), num_samples=1, sampling_params=params)
        for messages in prompts
    ]  # all in flight at once
    return [tokenizer.decode(f.result().sequences[0].tokens, skip_special_tokens=True) for f in futures]
