"""What the training scripts share: the SageMaker contract, distributed set-up, checkpoints, the frame
around a training loop, metric lines, data reading, model loading, and the maths and clients the job
scripts and the training-session side use alike.

Modules (import them by name: ``from common import contract, distributed, ...``):

- ``contract``      hyperparameters (an options dataclass read from ``--key value`` / ``SM_HPS``),
                    channels, ``SM_*`` paths, ``UserError`` and the ``main()`` wrapper that writes
                    the failure file.
- ``distributed``   torchrun ranks, ``Learners`` (who trains together), DDP / FSDP2 wrapping,
                    EFA settings for p4d/p4de/p5, gradient-sync and collective helpers.
- ``checkpoints``   atomic, resumable checkpoints (model, optimizer, scheduler, RNG, data position),
                    when to save them, the SIGTERM flag that spot interruptions set.
- ``training_run``  ``TrainingRun``, what every loop does around its steps: resume, when to log and
                    evaluate, a checkpoint at a step's end, the final model.
- ``metrics``       ``step=12 loss=0.4312 lr=1.2e-05`` lines, ``metrics.jsonl`` and a progress line.
- ``data``          JSONL reading with file/line/field errors, chat prompts as token ids,
                    reproducible batch order, padding.
- ``models``        model/tokenizer loading (``SM_CHANNEL_MODEL`` wins), dtypes, optimizer, final save.
- ``lm_loss``       the LM head's next-token loss a chunk of tokens at a time (``sft.py``'s
                    ``--loss_chunk_tokens``), without the full logits.
- ``generation``    sampling completions with ``generate``: GRPO's rollouts, evaluation, the
                    training-session service.
- ``preferences``   preference pairs' tokenisation and DPO's loss (torch alone: the training-session
                    side imports them as well).
- ``rewards``       a completion's reward from the environment's score (with the format reward's
                    weight), shared with the training-session side; standard library only.
- ``advantages``    GRPO's group-relative advantages, shared with the training-session side;
                    standard library only.
- ``episodes``      multi-turn episodes token in, token out (the model answers, a tool replies).
- ``distillation``  on-policy distillation's per-token advantages from a teacher's log-probs.
- ``llm_client``    one client for teacher and judge models behind an OpenAI-compatible endpoint
                    (concurrency cap, rate limits, retries, a cache that survives restarts).
- ``stats``         held-out figures with their standard errors, and answer collapse (torch-free).

The scripts run with their own folder as the working directory (``python sft.py``), so this
package is imported as the top-level ``common``; elsewhere the project's install gives it the
same name.
"""
