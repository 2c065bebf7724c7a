"""Sampling in shared generation passes: the requests in flight on a session run together, and a
seeded request's samples are the same alone, batched with others, or while another session samples.

In-process on the engine the endpoint runs (to count its passes and to hold its model busy while
requests queue), then through the endpoint with raw boto3 for two sessions at once."""

import functools
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from local_mode.session_service import engine as engine_module

from .conftest import trained_looking_engine

TINY_ARN = "arn:aws:sagemaker:us-east-1:aws:hub-content/SageMakerPublicHub/Model/local-tiny-qwen2/1.0.0"
PROMPT = [5, 6, 7, 8]
SEEDED = {"maxTokens": 24, "temperature": 1.0, "seed": 11}


@pytest.fixture(scope="module")
def session_engine(tiny_model_path, one_thread):
    return trained_looking_engine(tiny_model_path, seed=1)


def while_busy(engine, queue, calls: list) -> tuple[list, int]:
    """Every call made at once, from its own thread, while the model is busy (its lock held), so that all
    are waiting in ``queue`` when it frees; their answers and the passes they took."""
    answers = [None] * len(calls)

    def send(index, call):
        answers[index] = call()

    threads = [threading.Thread(target=send, args=(i, call)) for i, call in enumerate(calls)]
    passes = queue.passes
    with engine.lock:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while len(queue.pending) < len(calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(queue.pending) == len(calls)
    for thread in threads:
        thread.join(timeout=120)
    return answers, queue.passes - passes


def in_flight(engine, requests: list[tuple[list[int], int, dict]]) -> tuple[list[list[dict]], int]:
    """Every sample request sent at once while the model is busy: their answers and generation passes."""
    calls = [functools.partial(engine.sample, prompt, count, params) for prompt, count, params in requests]
    return while_busy(engine, engine.sampling, calls)


def tokens(samples: list[dict]) -> list[list[int]]:
    return [s["tokens"] for s in samples]


def test_requests_in_flight_share_one_generation_pass(session_engine):
    requests = [([5 + i] * (1 + i % 3), 2, dict(SEEDED, seed=i)) for i in range(8)]
    answers, passes = in_flight(session_engine, requests)
    assert passes == 1  # eight requests, sixteen samples, one generate
    assert all(len(samples) == 2 for samples in answers)
    # A pass holds at most MAX_SAMPLE_ROWS samples: more in flight take more passes, not one each.
    many = [([9], engine_module.MAX_SAMPLE_ROWS // 2, dict(SEEDED, seed=i)) for i in range(3)]
    _, passes = in_flight(session_engine, many)
    assert passes == 2


def test_a_seeded_request_samples_the_same_alone_and_batched_with_others(session_engine):
    alone = session_engine.sample(PROMPT, 3, SEEDED)
    assert len(set(map(tuple, tokens(alone)))) == 3  # sampled: the three rows differ
    # Others in the same pass: longer and shorter prompts (so this one is left-padded), other seeds,
    # other settings, a greedy one, one ending early at a stop string, one with more tokens to go.
    others = [
        ([9, 10, 11, 12, 13, 14, 15], 2, {"maxTokens": 40, "temperature": 0.7, "topP": 0.9, "seed": 1}),
        ([3], 4, {"maxTokens": 8, "temperature": 1.0, "topK": 20, "seed": 2}),
        ([7, 7], 1, {"maxTokens": 30, "temperature": 0.0}),
        ([4, 4, 4], 2, {"maxTokens": 30, "temperature": 1.0, "seed": 3, "stop": ["e"]}),
    ]
    for position in (0, 2, 4):  # first, in the middle, last in the batch
        requests = others[:position] + [(PROMPT, 3, SEEDED)] + others[position:]
        answers, passes = in_flight(session_engine, requests)
        assert passes == 1
        batched = answers[position]
        assert tokens(batched) == tokens(alone)
        for a, b in zip(alone, batched, strict=True):
            assert a["stopReason"] == b["stopReason"] and a["tokenUsage"] == b["tokenUsage"]
            torch.testing.assert_close(torch.tensor(b["logprobs"]), torch.tensor(a["logprobs"]), rtol=1e-4, atol=1e-4)
    # ... and each of the others (before ours in the last batch) got what it gets alone, its own token
    # limit and stop strings included.
    for request, batched in zip(others, answers[:4], strict=True):
        assert tokens(session_engine.sample(*request)) == tokens(batched)
    assert all(len(s["tokens"]) <= 8 for s in answers[1])
    stopped = [s for s in answers[3] if s["stopReason"] == "stop"]
    assert stopped and all("e" in session_engine.tokenizer.decode(s["tokens"]) for s in stopped)


def test_a_seeded_request_leaves_the_global_generator_alone(session_engine):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    session_engine.sample(PROMPT, 2, SEEDED)
    assert torch.equal(torch.rand(3), expected)  # the caller's own random stream is untouched


def test_two_sessions_sampling_at_once_get_what_each_gets_alone(clients):
    control, runtime = clients
    names = [f"t-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for name in names:
        control.create_training_session(
            TrainingSessionName=name,
            LoraConfig={"Rank": 4, "Alpha": 8},
            RoleArn="arn:aws:iam::123456789012:role/SageMakerRole",
            ModelConfig={"BaseModelArn": TINY_ARN},
            OutputConfig={"S3Location": {"Path": "s3://session-tests/out"}},
        )
    # Different seeds per session and per request: every request draws only from its own generator.
    requests = {
        name: [{"maxTokens": 512, "temperature": 1.0, "seed": 100 * s + r, "stop": ["a", "e"]} for r in range(4)]
        for s, name in enumerate(names)
    }

    def sample(name, params):
        op = runtime.execute_sampling_operation(
            trainingSessionName=name,
            operationConfig={
                "sample": {
                    "prompt": {"chunks": [{"tokens": PROMPT, "type": "encoded_text"}]},
                    "numSamples": 2,
                    "samplingParams": params,
                }
            },
        )["operationId"]
        deadline = time.monotonic() + 120
        while True:
            answer = runtime.get_sampling_operation_result(trainingSessionName=name, operationId=op)
            if answer["status"] in ("Completed", "Failed") or time.monotonic() > deadline:
                break
        assert answer["status"] == "Completed", answer
        return [s["tokens"] for s in answer["operationResult"]["sample"]["sequences"]]

    try:
        alone = {name: [sample(name, params) for params in requests[name]] for name in names}
        with ThreadPoolExecutor(max_workers=8) as pool:  # both sessions' requests in flight together
            futures = {name: [pool.submit(sample, name, params) for params in requests[name]] for name in names}
            together = {name: [future.result() for future in futures[name]] for name in names}
    finally:
        for name in names:
            control.stop_training_session(TrainingSessionName=name)
    assert together == alone
    assert alone[names[0]] != alone[names[1]]  # the seeds matter: the sessions did not sample alike


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"maxTokens": 8, "topP": 1.5}, "top_p 1.5 must be in"),
        ({"maxTokens": 8, "temperature": -1.0}, "temperature -1.0 must be >= 0"),
        ({"maxTokens": 0}, "max_new_tokens 0 must be >= 1"),
    ],
)
def test_bad_sampling_settings_are_refused_before_they_join_a_pass(session_engine, params, message):
    passes = session_engine.sampling.passes
    with pytest.raises(engine_module.InputError, match=message):
        session_engine.sample(PROMPT, 2, params)
    assert session_engine.sampling.passes == passes and not session_engine.sampling.pending


def test_a_saved_adapter_is_merged_once_and_samples_as_its_lora_layers_do(session_engine):
    from peft import get_peft_model_state_dict

    saved = {name: tensor.clone() for name, tensor in get_peft_model_state_dict(session_engine.model).items()}
    through_lora = session_engine.sample(PROMPT, 3, SEEDED)  # the engine's own adapter, unmerged
    merges = session_engine.merges
    merged = session_engine.sample(PROMPT, 3, SEEDED, saved)
    again = session_engine.sample([9, 9], 2, SEEDED, saved)  # the same saved sampler, another pass
    assert session_engine.merges == merges + 1 and len(again) == 2
    assert tokens(merged) == tokens(through_lora)
    for a, b in zip(through_lora, merged, strict=True):
        torch.testing.assert_close(torch.tensor(b["logprobs"]), torch.tensor(a["logprobs"]), rtol=1e-4, atol=1e-4)
    assert tokens(session_engine.sample(PROMPT, 3, SEEDED)) == tokens(through_lora)  # its adapter is untouched


def test_a_group_reads_its_prompt_once_and_samples_as_when_every_row_reads_it(session_engine):
    """The service prefills each distinct prompt of a pass once (``shared_prompt_prefill``): the same
    seeded samples, token for token, as ``sample_requests`` reading the prompt in every row."""
    from common.generation import SampleRequest, sample_requests

    # Two groups of different prompt lengths (one left-padded), one group twice, a greedy one.
    requests = [
        SampleRequest(PROMPT, 4, 24, seed=11),
        SampleRequest([9, 10, 11, 12, 13, 14, 15], 3, 24, temperature=0.7, seed=2),
        SampleRequest(PROMPT, 2, 24, seed=5),
        SampleRequest([7, 7], 1, 24, temperature=0.0),
    ]
    model, tokenizer, stop_ids = session_engine.model, session_engine.tokenizer, session_engine.stop_ids
    prompts_read = []  # the rows of the decoder's first call in a pass: its prefill
    hook = (
        model.get_base_model()
        .get_decoder()
        .register_forward_pre_hook(
            lambda module, args, kwargs: prompts_read.append(kwargs["input_ids"].shape), with_kwargs=True
        )
    )
    try:
        with session_engine.lock:
            every_row = sample_requests(model, tokenizer, requests, stop_ids)
            unshared_prefill = prompts_read[0]
            prompts_read.clear()
            with engine_module.shared_prompt_prefill(model):
                shared = sample_requests(model, tokenizer, requests, stop_ids)
    finally:
        hook.remove()
    assert unshared_prefill[0] == 10 and prompts_read[0][0] == 3  # ten rows, three distinct prompts
    assert prompts_read[1][1] == 1  # then one token a row, for every row
    assert "forward" not in vars(model.get_base_model())  # the model's own forward is back
    assert len({tuple(s.tokens) for s in shared[0]}) == 4  # one prompt read once, four different answers
    for a_group, b_group in zip(every_row, shared, strict=True):
        assert [s.tokens for s in b_group] == [s.tokens for s in a_group]
        for a, b in zip(a_group, b_group, strict=True):
            assert b.stop_reason == a.stop_reason
            torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), rtol=0, atol=1e-5)


def test_each_saved_adapter_is_merged_into_the_one_sampler_model_as_peft_merges_it(session_engine):
    """A new saved sampler is written into the tensors of the previous one, not a new copy of the model,
    and its weights are exactly those of peft's ``merge_and_unload`` on a copy with that adapter."""
    import copy

    from peft import get_peft_model_state_dict

    engine = session_engine
    first = {name: tensor.clone() for name, tensor in get_peft_model_state_dict(engine.model).items()}
    second = {name: tensor * 1.5 for name, tensor in first.items()}  # another step's adapter
    engine.sample(PROMPT, 1, SEEDED, first)
    sampler = engine.merged_sampler[1]
    before = engine.adapter_state()
    engine.sample(PROMPT, 1, SEEDED, second)
    assert engine.merged_sampler[1] is sampler  # the same model, its weights written again
    reference = copy.deepcopy(engine.model)
    engine_module._set_peft_state(reference, second)
    expected = reference.merge_and_unload().state_dict()
    merged = sampler.state_dict()
    assert merged.keys() == expected.keys()
    assert all(torch.equal(merged[name], expected[name]) for name in expected)
    after = engine.adapter_state()  # the session's own adapter, put back after the merge
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_requests_that_arrive_while_a_saved_adapter_merges_join_its_pass(session_engine, monkeypatch):
    """A step's first request starts the merge of its new saved sampler; the others, arriving over HTTP
    while it merges, join the same pass rather than wait for a second one."""
    from peft import get_peft_model_state_dict

    saved = {name: tensor * 0.5 for name, tensor in get_peft_model_state_dict(session_engine.model).items()}
    merge = session_engine._merge_for_sampling
    merging = threading.Event()

    def slow_merge(adapter):
        merging.set()
        time.sleep(0.5)  # a real model's merge; the tiny one's is instant
        return merge(adapter)

    monkeypatch.setattr(session_engine, "_merge_for_sampling", slow_merge)
    passes = session_engine.sampling.passes
    with ThreadPoolExecutor(max_workers=3) as pool:
        first = pool.submit(session_engine.sample, PROMPT, 2, SEEDED, saved)
        assert merging.wait(30)
        later = [pool.submit(session_engine.sample, [9, 10], 2, dict(SEEDED, seed=s), saved) for s in (1, 2)]
        answers = [first.result(), *(future.result() for future in later)]
    assert session_engine.sampling.passes - passes == 1
    assert all(len(samples) == 2 for samples in answers)


def test_scoring_requests_in_flight_share_one_pass_and_score_as_alone(session_engine):
    """compute_logprobs requests in flight (a distillation step scores every answer with its teacher)
    run as one padded forward pass, and each sequence gets the log-probs it gets alone, with the engine's
    own adapter and with a saved one swapped in."""
    from peft import get_peft_model_state_dict

    saved = {name: tensor.clone() * 0.5 for name, tensor in get_peft_model_state_dict(session_engine.model).items()}
    sequences = [[5 + i % 7] * (2 + 3 * i) + [9, 10, 11] for i in range(10)]  # lengths 5 to 32: padded rows
    for adapter in (engine_module.OWN_ADAPTER, saved):
        alone = [session_engine.compute_logprobs(tokens, adapter) for tokens in sequences]
        calls = [functools.partial(session_engine.compute_logprobs, tokens, adapter) for tokens in sequences]
        answers, passes = while_busy(session_engine, session_engine.scoring, calls)
        assert passes == 1
        for together, by_itself in zip(answers, alone, strict=True):
            assert together[0] is None and by_itself[0] is None
            torch.testing.assert_close(torch.tensor(together[1:]), torch.tensor(by_itself[1:]), rtol=1e-5, atol=1e-5)
    assert session_engine.compute_logprobs([5]) == [None]  # one token: nothing predicts it, no pass
