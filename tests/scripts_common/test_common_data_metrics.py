"""JSONL validation, batch order, metric lines."""

from __future__ import annotations

import json
import re

import pytest


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question": "q"}', "line 2: field 'answer' is missing"),
        ('{"question": "q", "answer": "  "}', "line 2: field 'answer' is empty"),
        ('{"question": "q", "answer": null}', "line 2: field 'answer' is empty"),
        ('{"question": "q", "answer": ', "line 2: not valid JSON"),
        ('["q", "a"]', "line 2: expected a JSON object"),
    ],
)
def test_read_jsonl_names_file_line_and_field(tmp_path, line, message):
    from common.contract import UserError
    from common.data import read_jsonl

    path = _write(tmp_path / "train.jsonl", ['{"question": "q", "answer": "a"}', line])
    with pytest.raises(UserError) as error:
        read_jsonl(path, ["question", "answer"])
    assert str(error.value).startswith(f"{path}, {message}")


def test_read_jsonl_rows_checks_and_empty_files(tmp_path):
    from common.contract import UserError
    from common.data import read_jsonl

    path = _write(tmp_path / "train.jsonl", ['{"x": 1}', "", '{"x": 2}'])
    assert read_jsonl(path, ["x"]) == [{"x": 1}, {"x": 2}]

    def positive(row):
        if row["x"] > 1:
            raise ValueError("x must be 1")

    with pytest.raises(UserError, match=r"line 3: x must be 1"):
        read_jsonl(path, ["x"], check=positive)
    with pytest.raises(UserError, match="has no rows"):
        read_jsonl(_write(tmp_path / "empty.jsonl", []), ["x"])
    with pytest.raises(UserError, match="does not exist"):
        read_jsonl(tmp_path / "nope.jsonl", ["x"])


def test_batch_order_is_reproducible_and_resumable():
    from common.data import BatchOrder

    order = BatchOrder(num_examples=10, batch_size=4, seed=3)
    batches = [order.next() for _ in range(6)]
    assert all(len(b) == 4 for b in batches)
    first_epoch = sum(batches, [])[:10]
    assert sorted(first_epoch) == list(range(10))  # every example once per epoch
    assert sum(batches, [])[10:20] != first_epoch  # a fresh permutation next epoch

    again = BatchOrder(10, 4, seed=3)
    for _ in range(3):
        again.next()
    resumed = BatchOrder(10, 4, seed=3)
    resumed.load_state_dict(again.state_dict())
    assert [resumed.next() for _ in range(3)] == batches[3:]
    assert BatchOrder(10, 4, seed=4).next() != batches[0]


def test_shard_batch_deals_micro_batches():
    from common.data import shard_batch
    from common.distributed import Learners

    indices = list(range(8))
    one = Learners(0, 1, 0, "cpu")
    assert shard_batch(indices, one, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    ranks = [shard_batch(indices, Learners(r, 2, r, "cpu"), 2) for r in range(2)]
    assert ranks == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


def test_evaluation_batches_cover_everything_once_in_equal_rounds():
    from common.data import evaluation_batches
    from common.distributed import Learners

    shares = [evaluation_batches(7, Learners(r, 2, r, "cpu"), 3) for r in range(2)]
    assert len(shares[0]) == len(shares[1]) == 2  # same number of forward passes on every learner
    counted = sorted(i for share in shares for indices, use in share if use for i in indices)
    assert counted == list(range(7))
    assert shares[1][1] == ([0, 1, 2], False)  # the padding batch is not counted


def test_metric_lines_match_the_notebook_regexes(tmp_path, capsys):
    from common.distributed import Learners
    from common.metrics import MetricLogger, format_metric_line

    line = format_metric_line(12, {"loss": 0.431249, "lr": 1.2e-05, "grad_norm": 12345.678, "tokens": 96})
    assert line == "step=12 loss=0.4312 lr=1.2e-05 grad_norm=1.235e+04 tokens=96"
    for name, value in [("loss", 0.4312), ("lr", 1.2e-05), ("grad_norm", 12350.0), ("tokens", 96)]:
        match = re.search(rf"\b{name}=(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)", line)
        assert float(match.group(1)) == value
    with pytest.raises(ValueError, match="must match"):
        format_metric_line(1, {"rewards/chosen": 0.1})

    path = tmp_path / "data" / "metrics.jsonl"
    main, other = Learners(0, 2, 0, "cpu"), Learners(1, 2, 1, "cpu")
    logger = MetricLogger(path, main, max_steps=4)
    MetricLogger(path, other, max_steps=4).log(1, {"loss": 9.0})  # rank 1 stays silent
    for step in (1, 2, 3):
        logger.add_tokens(100)
        logger.log(step, {"loss": 1.0 / step})
    out = capsys.readouterr().out
    assert out.count("step=1 ") == 1 and "progress: step 3/4 (75%)" in out and "tokens/s" in out
    # Resuming from step 2 drops step 3, which the resumed run logs again.
    MetricLogger(path, main, max_steps=4, resume_step=2).log(3, {"loss": 0.25})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in records] == [(1, 1.0), (2, 0.5), (3, 0.25)]


def test_reduce_sums_keeps_names_over_two_learners(tmp_path):
    """One all-reduce of named sums: each name gets its own total, whatever order each learner built
    its dict in (learner 1 builds it backwards)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "reduce_sums.py"
    script.write_text(
        "import sys\n"
        "import torch\n"
        "from common import distributed\n"
        "with distributed.started() as learners:\n"
        "    sums = {'tokens': 10.0 * (learners.rank + 1), 'reward': torch.tensor(0.5), 'groups': 1}\n"
        "    if learners.rank == 1:\n"
        "        sums = dict(reversed(sums.items()))\n"
        "    totals = distributed.reduce_sums(sums, learners)\n"
        # One write per line, flushed: the two learners share one pipe, and print() writes its
        # arguments in pieces that the other learner's line can land between.
        "    sys.stdout.write(f'rank {learners.rank} {list(totals)} {sorted(totals.items())}\\n')\n"
        "    sys.stdout.flush()\n"
    )
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "scripts"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc_per_node", "2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    expected = "[('groups', 2.0), ('reward', 1.0), ('tokens', 30.0)]"
    assert f"rank 0 ['tokens', 'reward', 'groups'] {expected}" in result.stdout
    assert f"rank 1 ['groups', 'reward', 'tokens'] {expected}" in result.stdout  # its own order back
