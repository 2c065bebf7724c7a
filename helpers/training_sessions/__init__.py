"""The building blocks of a loop that lives in a notebook cell and drives a SageMaker training session.

- ``connect``: the run mode, the service, opening and closing a session, the requests the SDK sends;
- ``datums``: training examples as the service takes them (supervised, policy gradient, on the wire);
- ``records``: a step's line, billable tokens and their cost, the record the main job's summary reads;
- ``data``: the notebooks' problems, read by the environments the job scripts use;
- ``sft``, ``dpo``, ``grpo``, ``code_rl``: each algorithm's pieces that are not the step itself;
- ``logprob_loss``: any loss of per-token log-probabilities, trained through ``cross_entropy``.

The step, the loop, is in the notebook. Rewards come from ``environments`` and shared maths from
``common``: the very modules the job scripts import in their container.
"""
