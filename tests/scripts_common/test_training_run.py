"""TrainingRun, the frame around every loop: it resumes model, optimizer, scheduler and data position
from the newest checkpoint, and says when to log and to evaluate."""

from __future__ import annotations

import json
import signal

import torch


def _training_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


def _step(model, optimizer, scheduler):
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def test_a_restarted_run_resumes_the_state_and_data_position_of_its_last_checkpoint(clean_env, tmp_path):
    from common.contract import TrainingArgs
    from common.data import BatchOrder
    from common.distributed import single_learner
    from common.training_run import TrainingRun

    clean_env.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path / "output"))
    args = TrainingArgs(max_steps=5, checkpoint_every=2, checkpoint_dir=str(tmp_path / "checkpoints"))
    learners = single_learner("cpu")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        model, optimizer, scheduler = _training_state()
        batch_order = BatchOrder(10, 3, seed=1)
        run = TrainingRun(args, learners, model, optimizer, scheduler, batch_order)
        assert (run.start_step, run.resumed) == (0, None)
        logger = run.start()
        batches = []
        for step in range(run.start_step + 1, 4):  # interrupted after step 3; step 2 was saved
            batches.append(batch_order.next())
            _step(model, optimizer, scheduler)
            logger.log(step, {"loss": float(step)})
            assert not run.end_step(step, note=f"saved at {step}")
        saved = {name: value.clone() for name, value in model.state_dict().items()}  # as of step 3

        model, optimizer, scheduler = _training_state()
        batch_order = BatchOrder(10, 3, seed=1)
        run = TrainingRun(args, learners, model, optimizer, scheduler, batch_order)
        assert run.start_step == 2 and run.resumed["note"] == "saved at 2"
        assert scheduler.last_epoch == 2
        assert batch_order.next() == batches[2]  # the batch step 3 saw comes again
        assert not torch.equal(model.weight, saved["weight"])  # step 2's weights, not step 3's
        run.start()  # metrics.jsonl keeps the records up to the step resumed from
        records = (tmp_path / "output" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in records] == [1, 2]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_logging_and_evaluation_steps(clean_env, tmp_path):
    from common.contract import TrainingArgs
    from common.data import BatchOrder
    from common.distributed import single_learner
    from common.training_run import TrainingRun

    args = TrainingArgs(max_steps=7, log_every=3, checkpoint_dir=str(tmp_path / "checkpoints"))
    model, optimizer, scheduler = _training_state()
    run = TrainingRun(args, single_learner("cpu"), model, optimizer, scheduler, BatchOrder(4, 2, seed=0))
    steps = range(1, 8)
    assert [s for s in steps if run.logs_at(s)] == [3, 6, 7]  # every --log_every steps and the last
    assert [s for s in steps if run.evaluates_at(s, eval_every=2)] == [2, 4, 6, 7]
    assert [s for s in steps if run.evaluates_at(s, eval_every=0)] == [7]  # 0: at the end only
    assert run.logs_at(2, evaluating=True)  # an evaluation always has its metric line
