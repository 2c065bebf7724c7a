"""Can the local OpenAI-compatible server (``transformers serve``) be an on-policy distillation teacher? A
teacher must return the log-prob of tokens it is given (the student's answer), which the OpenAI schema
asks for as ``echo`` with ``logprobs`` on /v1/completions, and vLLM as ``prompt_logprobs``. Notebook 16
says this server cannot; this test holds it to that, and fails the day the server learns to."""

from __future__ import annotations

import openai
import pytest

PROMPT = "Lena has 3 cards. How many cards does Lena have?\n#### 3"


@pytest.fixture(scope="module")
def client(llm_server):
    with openai.OpenAI(base_url=llm_server.base_url, api_key="local", max_retries=0) as client:
        yield client


def test_echo_with_logprobs_returns_no_log_prob_of_the_given_tokens(client, llm_server):
    answer = client.completions.create(model=llm_server.model, prompt=PROMPT, max_tokens=1, echo=True, logprobs=1)
    (choice,) = answer.choices
    assert choice.logprobs is None
    assert not choice.text.startswith(PROMPT)  # the prompt is not even echoed: only the generated text comes back


def test_chat_logprobs_are_ignored(client, llm_server):
    answer = client.chat.completions.create(
        model=llm_server.model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=2,
        logprobs=True,
        top_logprobs=1,
    )
    assert answer.choices[0].logprobs is None


def test_neither_token_ids_nor_vllms_prompt_logprobs_are_accepted(client, llm_server):
    with pytest.raises(openai.BadRequestError):  # a prompt as token ids: the student's exact tokens
        client.completions.create(model=llm_server.model, prompt=[1, 2, 3], max_tokens=1)
    with pytest.raises(openai.UnprocessableEntityError):  # vLLM's extension
        client.completions.create(
            model=llm_server.model, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 0}
        )
