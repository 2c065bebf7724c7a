"""Notebook 13's side of the teacher and the judge: the endpoint, the data sets, held-out answers.

- ``open_endpoint``: where the teacher and judge are. On SageMaker, the provider you configured with
  ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, and the Secrets Manager secret the jobs read the key from.
  In local mode, ``transformers serve`` on a model folder (offline), and the same secret in local
  mode's Secrets Manager. The key is never printed.
- ``read_jsonl_from_s3`` / ``original_conversations``: the problems and their reference solutions as
  SFT conversations, the baseline the teacher's data is compared with.
- ``greedy_answers``: held-out answers of a model folder, greedy, which
  ``helpers.training_sessions.grpo.answers_result`` scores with the GSM8K checker the jobs use.
- ``choice_token_ids``: the ids of "1" and "2" in a model folder's tokenizer, for a pairwise judge that
  answers with one constrained token (``environments.llm_judge.PairwiseJudge``).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
from pathlib import Path

from helpers.artifacts import download_and_extract, load_model, split_s3
from local_mode import llm_server


@dataclasses.dataclass(frozen=True)
class ModelAPI:
    base_url: str
    teacher_model: str
    judge_model: str
    secret_name: str
    # The judge tokenizer's ids of "1" and "2": the pairwise judge then answers with one constrained
    # token. None: it writes a JSON verdict.
    judge_choice_token_ids: dict[str, int] | None = None

    def describe(self) -> str:
        verdicts = (
            f'one token, "1" or "2" (ids {self.judge_choice_token_ids}), by logit_bias'
            if self.judge_choice_token_ids
            else "a JSON object"
        )
        return (
            f"endpoint {self.base_url}\nteacher model: {self.teacher_model}\njudge model: {self.judge_model}\n"
            f"pairwise verdicts: {verdicts}\n"
            f"API key: in the Secrets Manager secret {self.secret_name!r} (for jobs) and OPENAI_API_KEY (here)"
        )


def choice_token_ids(model_dir: str | Path, choices: tuple[str, ...] = ("1", "2")) -> dict[str, int]:
    """Each choice's token id in the tokenizer of ``model_dir``; each must be exactly one token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = {}
    for choice in choices:
        encoded = tokenizer.encode(choice, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(
                f"{choice!r} is {len(encoded)} tokens in the tokenizer of {model_dir}; a constrained choice needs "
                "one token per choice. Leave judge_choice_token_ids as None for JSON verdicts."
            )
        ids[choice] = encoded[0]
    return ids


def open_endpoint(
    ws,
    secret_name: str,
    local_model_dir: str | Path | None,
    teacher_model: str | None,
    judge_model: str | None,
    judge_choice_token_ids: dict[str, int] | None = None,
) -> ModelAPI:
    """The endpoint of the teacher and judge (see the module docstring). Sets ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY`` in this kernel in local mode; on SageMaker they must be set already.
    ``judge_choice_token_ids``: see ``ModelAPI``; in local mode, when None, read from the served model
    (the served folder's tokenizer is the judge's)."""
    secrets = ws.session.boto_session.client("secretsmanager")
    if ws.run_mode == "local":
        stack = contextlib.ExitStack()
        server = stack.enter_context(
            llm_server.serve(local_model_dir, log_path=Path(local_model_dir).parent / "llm-server.log")
        )
        atexit.register(stack.close)  # the server lives as long as the kernel
        os.environ.update(server.environment())
        with contextlib.suppress(secrets.exceptions.ResourceExistsException):
            secrets.create_secret(Name=secret_name, SecretString=os.environ["OPENAI_API_KEY"])
        secrets.put_secret_value(SecretId=secret_name, SecretString=os.environ["OPENAI_API_KEY"])
        if judge_choice_token_ids is None and not judge_model:
            judge_choice_token_ids = choice_token_ids(local_model_dir)
        return ModelAPI(
            server.base_url,
            teacher_model or server.model,
            judge_model or server.model,
            secret_name,
            judge_choice_token_ids,
        )
    missing = [name for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY") if not os.environ.get(name)]
    if missing or not teacher_model or not judge_model:
        raise RuntimeError(
            f"Set {' and '.join(missing) or 'the variables'} in this kernel's environment and give teacher_model "
            "and judge_model (names your endpoint lists at GET /v1/models)."
        )
    try:
        secrets.describe_secret(SecretId=secret_name)
    except secrets.exceptions.ResourceNotFoundException:
        raise RuntimeError(
            f"No secret {secret_name!r}: create it with `aws secretsmanager create-secret --name {secret_name} "
            "--secret-string <your key>`, and give the execution role secretsmanager:GetSecretValue on it."
        ) from None
    return ModelAPI(os.environ["OPENAI_BASE_URL"], teacher_model, judge_model, secret_name, judge_choice_token_ids)


def download_model(session, uri: str, dest: str | Path) -> Path:
    """A model from S3 as a local folder: a job's ``model.tar.gz`` unpacked, or a staged prefix copied."""
    if uri.endswith(".tar.gz"):
        return download_and_extract(session, uri, dest)
    bucket, prefix = split_s3(uri.rstrip("/") + "/")
    session.download_data(str(dest), bucket, key_prefix=prefix)
    return Path(dest)


def read_jsonl_from_s3(session, prefix_uri: str, filename: str) -> list[dict]:
    bucket, prefix = split_s3(prefix_uri.rstrip("/") + "/" + filename)
    body = session.boto_session.client("s3").get_object(Bucket=bucket, Key=prefix)["Body"].read().decode()
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def original_conversations(problems: list[dict]) -> list[dict]:
    """The problems with their reference solutions, as the SFT conversations ``sft.py`` reads."""
    from environments.gsm8k import GSM8KEnvironment

    env = GSM8KEnvironment()
    return [{"messages": [*env.prompt_messages(p), {"role": "assistant", "content": p["answer"]}]} for p in problems]


def greedy_answers(model_dir: str | Path, problems: list[dict], max_new_tokens: int) -> list[str]:
    """Each problem answered greedily by the model in ``model_dir``, prompted as the jobs prompt it."""
    import torch
    from environments.gsm8k import GSM8KEnvironment

    env = GSM8KEnvironment()
    model, tokenizer = load_model(model_dir)
    answers = []
    with torch.no_grad():
        for problem in problems:
            prompt = tokenizer.apply_chat_template(
                env.prompt_messages(problem), add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            output = model.generate(**prompt, max_new_tokens=max_new_tokens, do_sample=False)
            answers.append(tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True))
    return answers
