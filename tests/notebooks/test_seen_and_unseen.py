"""What "held out" holds out: the offline GSM8K set's test split (and notebook 8's count problems) is half
problems of the training templates with other names and numbers ("seen") and half of templates no training
problem uses ("unseen"), and every held-out evaluation reports each half beside the whole: a gain on the
seen half is recall, a gain on the unseen half is transfer."""

from __future__ import annotations

import pytest
from common import stats
from environments.gsm8k import GSM8KEnvironment

from helpers import metrics, results
from helpers.training_sessions import grpo, records
from local_mode import offline_data

SPLITS = {
    "gsm8k": lambda n_train, n_test, seed: offline_data.split_records("gsm8k", n_train, n_test, seed),
    "arithmetic": lambda n_train, n_test, seed: offline_data.split_records("arithmetic", n_train, n_test, seed),
    "count": offline_data.count_problem_split,
}


@pytest.mark.parametrize("name", sorted(SPLITS))
@pytest.mark.parametrize("n_test", [32, 9])
def test_the_test_split_is_half_seen_half_unseen_and_no_unseen_template_is_trained_on(name, n_test):
    split = SPLITS[name](64, n_test, 0)
    train, test = split["train"], split["test"]
    assert len(train) == 64 and len(test) == n_test
    assert all(r["template"] for r in train + test) and not any("split" in r for r in train)
    assert [r["split"] for r in test] == ["seen", "unseen"] * (n_test // 2) + ["seen"] * (n_test % 2)
    trained = {r["template"] for r in train}
    seen = {r["template"] for r in test if r["split"] == "seen"}
    unseen = {r["template"] for r in test if r["split"] == "unseen"}
    assert seen <= trained  # the seen half: templates the training split uses
    assert not unseen & trained and len(unseen) >= 2  # the unseen half: never in training, of several kinds
    # other names and numbers: no held-out question is a training question
    assert not {r["question"] for r in test} & {r["question"] for r in train}
    scores = GSM8KEnvironment().score(test, [offline_data.solution_text(r["answer"]) for r in test])
    assert all(s["correct"] for s in scores)  # every reference is the checker's number


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_the_split_is_the_same_for_a_seed_and_another_for_another_seed(name):
    assert SPLITS[name](32, 16, 3) == SPLITS[name](32, 16, 3)
    assert SPLITS[name](32, 16, 3)["test"] != SPLITS[name](32, 16, 4)["test"]


def test_the_unseen_templates_are_the_seen_skills_in_other_words():
    test = offline_data.split_records("gsm8k", 64, 400, 0)["test"]
    unseen = {r["template"] for r in test if r["split"] == "unseen"}
    seen = {r["template"] for r in offline_data.gsm8k_easy_records(400)}
    assert seen == {"dozen", "week", "pair", "triangle", "spider", "half_hour", "stated", "more", "left"}
    assert unseen == {f"{template}_reworded" for template in seen}
    questions = {r["template"]: r["question"] for r in test}
    assert " more" not in questions["more_reworded"] and "left" not in questions["left_reworded"]


def test_the_arithmetic_set_asks_the_easy_sums_with_three_digit_numbers():
    # notebook 15's offline set: the easy set's "more" and "left" wordings, seen and reworded, with numbers
    # a small model cannot add in its head; every reference is the exact sum or difference
    split = offline_data.split_records("arithmetic", 64, 400, 0)
    assert {r["template"] for r in split["train"]} == {"more", "left"}
    assert {r["template"] for r in split["test"] if r["split"] == "unseen"} == {"more_reworded", "left_reworded"}
    for record in split["train"] + split["test"]:
        calculation = record["answer"].split("<<")[1].split("=")[0]
        first, second = map(int, calculation.replace("-", "+").split("+"))
        assert 100 <= min(first, second) and max(first, second) <= 999
        assert f"{first}" in record["question"] and f"{second}" in record["question"]
        answer = first - second if "-" in calculation else first + second
        assert ("-" in calculation) == record["template"].startswith("left") and answer > 0
        assert offline_data.gsm8k_final_number(record["answer"]) == str(answer)
    wordings = {template: question for template, (question, _) in {**offline_data._MORE, **offline_data._LEFT}.items()}
    assert split["test"][1]["question"].split()[-3:] == wordings[split["test"][1]["template"]].split()[-3:]


def test_the_arithmetic_set_is_offline_only_and_notebook_0_stages_it_offline():
    from helpers import data_prep

    assert "arithmetic" in data_prep.data_sets("offline") and "arithmetic" not in data_prep.data_sets("hub")
    assert set(data_prep.data_sets("hub")) == {"gsm8k", "preferences", "chat", "code", "functions"}
    with pytest.raises(ValueError, match="offline only.*'gsm8k'"):
        data_prep.load("arithmetic", "hub")


def test_the_local_base_models_and_sft_data_see_only_seen_templates():
    # format_tuned_models' tool model trains on gsm8k_easy_records; the SFT conversations ask them too
    seen = {r["template"] for r in offline_data.gsm8k_easy_records(2000, seed=1)}
    assert not any(t.endswith("_reworded") for t in seen)
    unseen_questions = {r["question"] for r in offline_data.split_records("gsm8k", 0, 400, 0)["test"][1::2]}
    asked = {m["content"] for r in offline_data.chat_records(400) for m in r["messages"] if m["role"] == "user"}
    assert not unseen_questions & asked
    assert all(r["template"] == "count" for r in offline_data.count_problem_records(600, seed=1))


def test_notebook_0_and_the_fixtures_write_the_same_split(tmp_path):
    from helpers import data_prep

    staged = data_prep.load("gsm8k", "offline", n_train=16, n_test=8, seed=2, workdir=tmp_path / "prep")
    folders = offline_data.write_all(tmp_path / "fixtures", n_train=16, n_test=8, seed=2)
    for split in ("train", "test"):
        written = offline_data.read_jsonl(folders["gsm8k"] / f"{split}.jsonl")
        assert written == offline_data.split_records("gsm8k", 16, 8, 2)[split]
        assert [dict(row) for row in staged[split]] == written
    # the other sets are split as before: the first n_train records, then the rest
    code = offline_data.code_problem_records(24, seed=2)
    assert offline_data.read_jsonl(folders["code"] / "test.jsonl") == code[16:]


# --------------------------------------------------------------------------- the figures per split


def scored(rows: list[list[int]], splits: list[str | None]) -> list[dict]:
    """Scored groups as ``grpo.score_groups`` leaves them, one a problem: right (1) or not (0) per answer."""
    return [
        {"problem": {"question": f"q{i}", **({"split": s} if s else {})}, "scores": [{"correct": bool(c), "format_reward": 1.0} for c in row]}
        for i, (row, s) in enumerate(zip(rows, splits, strict=True))
    ]  # fmt: skip


SPLIT_OF = ["seen", "unseen"] * 8


def test_a_sessions_held_out_result_and_record_report_each_split():
    before_rows = [[0, 0]] * 16
    after_rows = [[1, 1] if i % 2 == 0 else ([1, 0] if i in (1, 3) else [0, 0]) for i in range(16)]
    answers = [str(i) for i in range(32)]
    before = grpo.held_out_result(scored(before_rows, SPLIT_OF), answers, 2)
    after = grpo.held_out_result(scored(after_rows, SPLIT_OF), answers, 2)
    assert {name: (part["n"], part["accuracy"]) for name, part in after["splits"].items()} == {
        "seen": (8, 1.0),
        "unseen": (8, 1 / 8),
    }
    assert after["splits"]["unseen"]["standard_error"] == stats.mean_and_standard_error([0.5, 0.5] + [0.0] * 6)[1]
    # each split's answers are its own problems': the unseen half gave answers 2, 3, 6, 7, ...
    assert after["splits"]["unseen"]["answer_diversity"]["answers"] == 16
    assert after["accuracy"] == pytest.approx(9 / 16)  # the whole set's figure is as before
    held_out = grpo.held_out_record(before, after)
    seen, unseen = held_out["splits"]["seen"], held_out["splits"]["unseen"]
    assert (seen["change"], seen["change_standard_error"]) == (1.0, 0.0)
    assert (unseen["change"], unseen["change_standard_error"]) == stats.paired_change([0.0] * 8, [0.5, 0.5] + [0.0] * 6)
    lines = records.held_out_lines(held_out)
    assert lines[-2].startswith(
        "seen templates (8 problems; templates the training problems use; a rise here is recall"
    )
    assert lines[-1] == (
        "unseen templates (8 problems; templates no training problem uses; a rise here is transfer): "
        "0.000 ± 0.000 -> 0.125 ± 0.082, change +0.125 ± 0.082, "
        + stats.judge_change(unseen["change"], unseen["change_standard_error"], unseen["after_answer_diversity"])
    )
    assert lines[-1].endswith("+1.5 standard errors: within 2 standard errors, not a gain")


def test_problems_without_a_split_report_the_whole_set_only():
    # openai/gsm8k's rows have no "split": the figures are the whole set's, as before
    result = grpo.held_out_result(scored([[1, 0], [0, 0]], [None, None]), ["1", "2", "3", "4"], 2)
    assert result["splits"] == {}
    held_out = grpo.held_out_record(result, result)
    assert held_out["splits"] == {} and not any("templates" in line for line in records.held_out_lines(held_out))
    assert [
        row["what"] for row in results.rows({"training_sessions": [{"notebook": "08_x", "held_out": held_out}]})
    ] == ["GRPO (training session): held-out accuracy, 2 problems x 2 answer(s)"]


def job_evaluation(accuracies: list[float], answers: list[str]) -> dict:
    """An evaluate.py result of problems that name their split, with its ``splits`` as evaluate.py computes them."""
    examples = [{"question": f"q{i}", "split": SPLIT_OF[i]} for i in range(len(accuracies))]
    figures = stats.by_split(SPLIT_OF, accuracies, [[a] for a in answers])
    accuracy, error = stats.mean_and_standard_error(accuracies)
    return {
        "accuracy": accuracy,
        "standard_error": error,
        "n": len(accuracies),
        "samples_per_example": 1,
        "temperature": 0.0,
        "seed": 42,
        "records": [{"example": e, "accuracy": a, "answer": b} for e, a, b in zip(examples, accuracies, answers, strict=True)],
        "answer_diversity": stats.answer_diversity(answers),
        "splits": figures,
    }  # fmt: skip


def test_notebook_6s_change_its_lines_and_the_summary_rows_report_each_split():
    before = job_evaluation([0.0] * 16, [str(100 + i) for i in range(16)])
    after = job_evaluation([1.0, 0.0] * 8, [str(i) for i in range(16)])  # every seen problem right, no unseen one
    held_out = metrics.held_out_change(before, after)
    assert held_out["splits"]["seen"]["change"] == 1.0 and held_out["splits"]["unseen"]["change"] == 0.0
    text = metrics.describe_change(held_out).splitlines()
    assert text[-2].startswith("seen templates (8 problems;") and text[-2].endswith(
        "no spread to measure it against: not a gain"
    )
    assert text[-1].startswith("unseen templates (8 problems;") and "0.000 ± 0.000 -> 0.000 ± 0.000" in text[-1]
    rows = results.rows({"evaluation": {"base": before, "trained": after, "held_out_change": held_out}})
    assert [row["notebook"] for row in rows] == ["06"] * 3
    assert rows[1]["what"] == "of which 8 of seen templates (a rise there is recall of a pattern)"
    assert rows[2]["what"] == "of which 8 of unseen templates (a rise there is transfer)"
    assert (rows[2]["before"], rows[2]["after"], rows[2]["verdict"]) == ("0.000 ± 0.000", "0.000 ± 0.000", "not a gain")
    # an evaluation.json from before splits were reported, or of openai/gsm8k: no split lines
    del before["splits"], after["splits"]
    assert metrics.held_out_change(before, after)["splits"] == {}


def test_a_part_of_a_collapsed_models_answers_is_no_gain_even_where_the_part_looks_varied():
    # notebook 6's tiny run: the GRPO model answers '2' to 24 of 32 problems, 8 of them in the unseen half
    before = job_evaluation([0.0] * 16, [str(100 + i) for i in range(16)])
    seen_answers, unseen_answers = ["2"] * 8, ["2"] * 4 + ["40", "42", "44", "46"]  # the unseen half: 4 of 8 '2'
    answers = [a for pair in zip(seen_answers, unseen_answers, strict=True) for a in pair]  # 12 of 16 '2'
    after = job_evaluation([1.0, 1.0] * 6 + [0.0] * 4, answers)
    held_out = metrics.held_out_change(before, after)
    unseen = held_out["splits"]["unseen"]
    assert not stats.collapsed(after["splits"]["unseen"]["answer_diversity"])
    assert stats.collapsed(after["answer_diversity"]) and unseen["after_answer_diversity"] == after["answer_diversity"]
    assert unseen["change"] > 2 * unseen["change_standard_error"] > 0  # large enough, were the model not collapsed
    assert metrics.describe_change(held_out).splitlines()[-1].endswith("'2', not counted as a gain")
    rows = results.rows({"evaluation": {"base": before, "trained": after, "held_out_change": held_out}})
    assert [row["verdict"] for row in rows] == ["collapsed: not a gain"] * 3
