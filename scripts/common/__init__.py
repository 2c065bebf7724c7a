"""What every training script shares: the SageMaker contract, distributed set-up, checkpoints,
metric lines, data reading, model loading and the failure file.

Modules (import them by name: ``from common import contract, distributed, ...``):

- ``contract``     hyperparameters (an options dataclass read from ``--key value`` / ``SM_HPS``),
                   channels, ``SM_*`` paths, ``UserError`` and the ``main()`` wrapper that writes
                   the failure file.
- ``distributed``  torchrun ranks, ``Learners`` (who trains together), DDP / FSDP2 wrapping,
                   EFA settings for p4d/p4de/p5, gradient-sync and collective helpers.
- ``checkpoints``  atomic, resumable checkpoints (model, optimizer, scheduler, RNG, data position),
                   the SIGTERM flag that spot interruptions set.
- ``metrics``      ``step=12 loss=0.4312 lr=1.2e-05`` lines, ``metrics.jsonl`` and a progress line.
- ``data``         JSONL reading with file/line/field errors, reproducible batch order.
- ``models``       model/tokenizer loading (``SM_CHANNEL_MODEL`` wins), dtypes, final save.
- ``preferences``  preference pairs' tokenisation and DPO's loss (torch alone: the training-session
                   side imports them as well).

The scripts run with their own folder as the working directory (``python sft.py``), so this
package is imported as the top-level ``common``.
"""
