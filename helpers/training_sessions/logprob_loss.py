"""Any loss of per-token log-probabilities, trained on a training session through the built-in ``cross_entropy``.

The service trains with four losses (``cross_entropy``, ``importance_sampling``, ``ppo``, ``cispo``). A loss
``L`` that is a function of the log-probabilities ``logp_t`` of the datums' target tokens (DPO, KTO, a
squared error on log-likelihoods, ...) still trains exactly, in three calls:

1. ``forward(datums)``: every target token's ``logp_t`` at the current weights (no gradient);
2. here, in torch: ``L`` and ``g_t = dL/dlogp_t`` (autograd on the returned numbers);
3. ``forward_backward(datums with weights w = -g, "cross_entropy")``.

``cross_entropy`` is ``-sum_t w_t * logp_t``, so the service's parameter gradient is
``sum_t g_t * d logp_t / d theta``, which by the chain rule is ``dL/dtheta``: an ``optim_step`` after it
applies ``L``'s update. Nothing beyond the public API is used, so it works unchanged against AWS.

Limits, plainly:

- **Only functions of the target tokens' log-probabilities.** A loss that needs hidden states, the full
  vocabulary distribution (entropy, a KL to another model's whole distribution, top-k terms) or the
  logits of tokens other than each datum's targets cannot be built this way.
- **One extra forward pass a step**: the batch is processed twice (billed as prefill, then as
  training tokens) and the step waits for the forward's answer before it can send the backward.
- **Exact only at the weights the forward saw.** ``g`` is the gradient at those weights: no
  ``optim_step`` may run between the forward and its ``forward_backward``. The service runs a session's
  operations in sequence-number order, so send the next step's forward after this step's
  ``optim_step`` (as ``forward_backward`` below does), never in between.
- The service reports the ``cross_entropy`` call's loss as ``-sum(w * logp)``, which is not ``L``: read
  ``L`` from here. Weights travel as float32, so ``g`` is exact to float32's precision.

Tinker's ``forward_backward_custom`` is the same technique; SageMaker's SDK has no such call, hence this module.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.training_sessions import datum_tools

# A loss of the batch's per-token log-probabilities (one 1-D tensor per datum, one value per model_input
# token, prompt positions included: mask them with the datum's weights): the scalar to minimise, or the
# scalar and a dict of metrics to log.
LogprobLoss = Callable[[list[torch.Tensor]], "torch.Tensor | tuple[torch.Tensor, dict]"]


def token_logprobs(training_client, datums) -> list[torch.Tensor]:
    """Step 1: ``logp_t`` of every datum's target tokens at the session's current weights, one forward pass."""
    outputs = training_client.forward(datums, loss_fn="cross_entropy").result().loss_fn_outputs
    return [torch.tensor(datum_tools.values(output["logprobs"]), dtype=torch.float64) for output in outputs]


def gradient_weights(loss_fn: LogprobLoss, logprobs: list[torch.Tensor]) -> tuple[float, list[torch.Tensor], dict]:
    """Step 2: ``L`` at ``logprobs``, and the cross-entropy weights ``w = -dL/dlogp`` (one tensor per datum).
    Returns ``(L, weights, metrics)``."""
    leaves = [lp.detach().clone().requires_grad_(True) for lp in logprobs]
    result = loss_fn(leaves)
    loss, metrics = result if isinstance(result, tuple) else (result, {})
    if loss.dim() != 0:
        raise ValueError(
            f"The loss must be a scalar (reduce it with .sum() or .mean()); got shape {tuple(loss.shape)}."
        )
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)  # None: the loss does not read that datum
    weights = [torch.zeros_like(lp) if g is None else -g for lp, g in zip(leaves, grads, strict=True)]
    return float(loss.detach()), weights, metrics


def weighted(datums, weights: list[torch.Tensor]) -> list:
    """Step 3's datums: the same tokens and targets, ``weights`` in place of the datums' own."""
    from sagemaker.train.training_session import Datum

    return [
        Datum(
            model_input=datum.model_input,
            loss_fn_inputs={**datum.loss_fn_inputs, "weights": [float(x) for x in w.tolist()]},
        )
        for datum, w in zip(datums, weights, strict=True)
    ]


def forward_backward(training_client, datums, loss_fn: LogprobLoss):
    """Steps 1-3 in one call: the ``forward_backward`` future (send ``optim_step`` after it), ``L`` and the
    loss's metrics. ``datums`` carry the target tokens (and, as weights, whatever mask ``loss_fn`` reads)."""
    loss, weights, metrics = gradient_weights(loss_fn, token_logprobs(training_client, datums))
    future = training_client.forward_backward(weighted(datums, weights), loss_fn="cross_entropy")
    return future, loss, metrics
