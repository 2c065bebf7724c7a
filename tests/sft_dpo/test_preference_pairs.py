"""The offline preference pairs and the held-out likelihood accuracy ``dpo.py`` logs before and after training."""

from __future__ import annotations

import pytest
import torch
from environments.gsm8k import extract_answer, has_final_line, reference_answer

from local_mode.offline_data import preference_records


def test_chosen_ends_with_the_checkers_line_and_rejected_does_not():
    rows = preference_records(40, seed=3)
    assert len(rows) == 40
    for row in rows:
        assert set(row) == {"prompt", "chosen", "rejected"}
        assert has_final_line(row["chosen"]), row
        final_line = row["chosen"].rsplit("\n", 1)[1]
        assert final_line.startswith("#### ")
        assert final_line not in row["rejected"] and "####" not in row["rejected"], row
        assert not has_final_line(row["rejected"]), row
        # the same worked steps: what tells the two apart is only how the answer ends
        steps = row["chosen"].rsplit("\n", 1)[0]
        assert row["rejected"].startswith(steps), row
    # both kinds of rejected answer, half each: stopped after the last step, or the answer in words
    stopped = [r for r in rows if r["rejected"] == r["chosen"].rsplit("\n", 1)[0]]
    worded = [r for r in rows if r["rejected"].endswith(f"The answer is {reference_answer(r['chosen'])}.")]
    assert len(stopped) == len(worded) == 20


def test_the_chosen_answer_is_right_by_the_checker():
    for row in preference_records(12, seed=0):
        assert extract_answer(row["chosen"]) == reference_answer(row["chosen"])


def test_pairs_are_deterministic_per_seed():
    assert preference_records(16, seed=4) == preference_records(16, seed=4)
    assert preference_records(16, seed=4) != preference_records(16, seed=5)
    # answers as a model should write them: without GSM8K's <<48/2=24>> calculator annotations
    assert not [r for r in preference_records(16, seed=4) if "<<" in r["chosen"] + r["rejected"]]


def _likelihood_accuracy_of(model_path, rows) -> float:
    """The share of pairs where ``model_path`` gives the chosen answer the higher summed log-probability,
    computed here without dpo.py: one pair at a time, no batching, no padding."""
    from common.preferences import tokenize_pair
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()

    def logp(prompt_ids, answer_ids) -> float:
        ids = torch.tensor([prompt_ids + answer_ids])
        with torch.no_grad():
            token_logps = model(ids).logits[0, :-1].float().log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
        return float(token_logps[len(prompt_ids) - 1 :].sum())

    wins = []
    for row in rows:
        pair = tokenize_pair(tokenizer, row, 512, 1024)
        wins.append(logp(pair["prompt_ids"], pair["chosen_ids"]) > logp(pair["prompt_ids"], pair["rejected_ids"]))
    return sum(wins) / len(wins)


def test_dpo_logs_held_out_likelihood_accuracy_before_and_after(
    tmp_path, offline_data, tiny_model_path, tiny_args, run_in_process, read_metrics
):
    from common.data import read_jsonl

    channels = {"train": offline_data["preferences"], "test": offline_data["preferences"]}
    run_in_process("dpo", tiny_args + ["--max_steps", "3", "--checkpoint_every", "0"], tmp_path, channels)
    records = read_metrics(tmp_path)
    before, after = records[0], records[-1]
    assert before["step"] == 0 and after["step"] == 3
    test_rows = read_jsonl(offline_data["preferences"] / "test.jsonl", ("prompt", "chosen", "rejected"))
    n = len(test_rows)
    # before the first step: the base model's own preferences, as computed directly
    assert before["eval_likelihood_accuracy"] == pytest.approx(_likelihood_accuracy_of(tiny_model_path, test_rows))
    p = before["eval_likelihood_accuracy"]
    assert before["eval_likelihood_accuracy_se"] == pytest.approx((p * (1 - p) / (n - 1)) ** 0.5, rel=1e-3)
    assert before["eval_likelihood_accuracy_change"] == 0 and before["eval_likelihood_accuracy_change_se"] == 0
    assert before["eval_rewards_accuracies"] == 0  # policy == reference: every reward is 0
    # at the end: the trained model's, with its paired change against the base model's on the same pairs
    for name in ("eval_likelihood_accuracy", "eval_likelihood_accuracy_se", "eval_likelihood_accuracy_change_se"):
        assert name in after
    assert after["eval_reference_likelihood_accuracy"] == before["eval_likelihood_accuracy"]  # the starting model
    assert after["eval_reference_likelihood_accuracy_se"] == before["eval_likelihood_accuracy_se"]
    change = after["eval_likelihood_accuracy"] - before["eval_likelihood_accuracy"]
    assert after["eval_likelihood_accuracy_change"] == pytest.approx(change)
    assert after["eval_pairs"] == n
