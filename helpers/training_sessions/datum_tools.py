"""Building datums: the training examples a session's ``forward_backward`` takes, built from token ids.

Position i of ``model_input`` predicts ``target_tokens[i]``. Losses on the service are **sums** over
tokens and datums: the loop owns normalisation (the notebooks divide by ``target_tokens(datums)``).
"""

from __future__ import annotations


def supervised_datum(prompt: list[int], answer: list[int]):
    """One SFT example. Position i of ``model_input`` predicts ``target_tokens[i]``: the shift by one.
    Weight 0 on targets that are prompt tokens, 1 on the answer's: only the answer is learned.

        tokens        p0 p1 p2 a0 a1 a2
        model_input   p0 p1 p2 a0 a1
        target_tokens p1 p2 a0 a1 a2
        weights       0  0  1  1  1
    """
    from sagemaker.train.training_session import Datum, ModelInput

    tokens = prompt + answer
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
    return Datum(
        model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights}
    )


def policy_gradient_datum(prompt: list[int], sample, advantage: float):
    """One sampled completion for importance_sampling / ppo: the same shift, the sampler's logprobs
    and the advantage on the completion's tokens, zeros on the prompt's."""
    from sagemaker.train.training_session import Datum, ModelInput

    tokens = prompt + list(sample.tokens)
    n_prompt, n_answer = len(prompt) - 1, len(sample.tokens)
    return Datum(
        model_input=ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "weights": [0.0] * n_prompt + [1.0] * n_answer,
            "logprobs": [0.0] * n_prompt + [float(x) for x in sample.logprobs],
            "advantages": [0.0] * n_prompt + [advantage] * n_answer,
        },
    )


def wire_datum(datum) -> dict:
    """A datum as ExecuteTrainingOperation's ``datumList`` takes it (the raw API, notebook 10)."""
    return {
        "modelInput": {"chunks": [{"tokens": datum.model_input.to_ints(), "type": "encoded_text"}]},
        "lossFnInputs": {
            "target_tokens": {"data": values(datum.loss_fn_inputs["target_tokens"]), "dtype": "int64"},
            "weights": {"data": values(datum.loss_fn_inputs["weights"]), "dtype": "float32"},
        },
    }


def target_tokens_of_wire(datum_list: list[dict]) -> int:
    return sum(sum(1 for w in d["lossFnInputs"]["weights"]["data"] if w) for d in datum_list)


def target_tokens(datums) -> int:
    """Tokens with a non-zero weight: what the summed loss is divided by."""
    return sum(sum(1 for w in values(d.loss_fn_inputs["weights"]) if w) for d in datums)


def values(tensor) -> list:
    """A loss input or output as a plain list (a TensorData, its wire dict, or a list)."""
    if isinstance(tensor, dict):
        return tensor["data"]
    return list(getattr(tensor, "data", tensor))


# --------------------------------------------------------------------------- RL pieces
