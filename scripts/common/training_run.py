"""What every training loop does around its steps (``sft.py``, ``dpo.py``, ``grpo.py``): resume from
the newest checkpoint, decide when to log and evaluate, checkpoint at a step's end (by schedule, or
on SIGTERM and then stop) and save the final model. The loop itself stays in the script::

    run = TrainingRun(args, learners, model, optimizer, scheduler, batch_order)  # resumes if it can
    logger = run.start()
    for step in range(run.start_step + 1, args.max_steps + 1):
        ...                                   # batch, forward, backward, optimizer step
        if run.logs_at(step):
            logger.log(step, record)
        if run.end_step(step):                # SIGTERM: the checkpoint is written, stop
            return False
    run.finish(tokenizer)
"""

from __future__ import annotations

from common import checkpoints, contract, metrics, models
from common.data import BatchOrder
from common.distributed import Learners


class TrainingRun:
    """One run of a loop over ``args.max_steps`` steps (``args``: a script's ``contract.TrainingArgs``).

    Made once the model, optimizer, scheduler and batch order exist: it restores the newest whole
    checkpoint into them (``checkpoints.Checkpointer.load_latest``) and the batch order's position.
    ``start_step`` is the last step done (0 when starting fresh); ``resumed`` the checkpoint's
    ``extra`` (None when starting fresh), for what a script saved of its own. ``trainable_only``:
    checkpoints hold the trainable parameters only (LoRA)."""

    def __init__(
        self,
        args: contract.TrainingArgs,
        learners: Learners,
        model,
        optimizer,
        scheduler,
        batch_order: BatchOrder,
        trainable_only: bool = False,
    ):
        self.args, self.learners, self.batch_order = args, learners, batch_order
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.checkpointer = checkpoints.Checkpointer(
            args.checkpoint_dir or contract.default_checkpoint_dir(),
            learners,
            keep=args.keep_checkpoints,
            trainable_only=trainable_only,
            background=args.checkpoint_in_background,
        )
        resumed = self.checkpointer.load_latest(model, optimizer, scheduler)
        self.start_step = 0 if resumed is None else resumed["step"]
        self.resumed = None if resumed is None else resumed["extra"]
        if self.resumed is not None:
            batch_order.load_state_dict(self.resumed["batch_order"])
        self.sigterm: checkpoints.SigtermFlag | None = None
        self.schedule: checkpoints.CheckpointSchedule | None = None

    def start(self) -> metrics.MetricLogger:
        """Call just before the first step: the metric logger (``metrics.jsonl`` cut back to the step
        resumed from), and from here on SIGTERM saves a checkpoint and stops the loop."""
        logger = metrics.MetricLogger(
            contract.output_data_dir() / "metrics.jsonl", self.learners, self.args.max_steps, self.start_step
        )
        self.sigterm = checkpoints.SigtermFlag()
        self.schedule = checkpoints.CheckpointSchedule(self.args.checkpoint_every, self.args.checkpoint_every_minutes)
        return logger

    def evaluates_at(self, step: int, eval_every: int) -> bool:
        """Held-out evaluation at the last step and every ``eval_every`` steps (0: the last step only)."""
        return step == self.args.max_steps or (eval_every > 0 and step % eval_every == 0)

    def logs_at(self, step: int, evaluating: bool = False) -> bool:
        """A metric line every ``--log_every`` steps, at the last step and with every evaluation."""
        return step % self.args.log_every == 0 or step == self.args.max_steps or evaluating

    def end_step(self, step: int, **extra) -> bool:
        """The end of a step, on every learner: a checkpoint when the schedule says so or SIGTERM came,
        holding the batch order's position and ``extra``. True when the loop must stop (SIGTERM: the
        checkpoint the restarted job resumes from is written)."""
        return checkpoints.save_at_step_end(
            step,
            self.checkpointer,
            self.schedule,
            self.sigterm,
            self.model,
            self.optimizer,
            self.scheduler,
            extra={"batch_order": self.batch_order.state_dict(), **extra},
        )

    def finish(self, tokenizer) -> None:
        """The final model and tokenizer in ``SM_MODEL_DIR`` (LoRA merged), once a checkpoint still being
        written in the background is done (it needs the process group)."""
        self.checkpointer.wait()
        models.save_final_model(self.model, tokenizer, contract.model_dir(), self.learners)
