"""Generation and log-probs on padded batches: what one batched call gives equals what each prompt
gives alone, so left padding changes nothing the loss sees."""

import grpo
import torch
from common import distributed, generation
from common.data import pad_rows


def load(tiny_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_path), AutoTokenizer.from_pretrained(tiny_model_path)


def test_batched_greedy_generation_equals_one_prompt_at_a_time(tiny_model_path):
    model, tokenizer = load(tiny_model_path)
    generator = generation.HFGenerator(
        model, tokenizer, max_new_tokens=6, temperature=1.0, learners=distributed.single_learner("cpu")
    )
    prompts = [tokenizer(text)["input_ids"] for text in ("Natalia sold", "How many apples does Weng have left", "7")]
    batched_ids, batched_texts = generator.generate(prompts, group_size=2, greedy=True)
    assert len(batched_ids) == 6
    for index, prompt in enumerate(prompts):
        alone_ids, alone_texts = generator.generate([prompt], group_size=1, greedy=True)
        assert batched_ids[2 * index] == batched_ids[2 * index + 1] == alone_ids[0]
        assert batched_texts[2 * index] == alone_texts[0]
    assert model.generation_config.top_k != 0  # the model's own settings are back after the call


def test_sampling_stops_at_the_stop_token_and_keeps_it(tiny_model_path):
    model, tokenizer = load(tiny_model_path)
    generator = generation.HFGenerator(
        model, tokenizer, max_new_tokens=12, temperature=1.0, learners=distributed.single_learner("cpu")
    )
    prompt = tokenizer("Pick")["input_ids"]
    # The untrained model samples almost uniformly; with every third token a stop token, samples stop
    # after a few tokens, at different lengths.
    generator.stop_ids = sorted(set(range(0, len(tokenizer), 3)) | {tokenizer.eos_token_id})
    torch.manual_seed(0)
    ids, texts = generator.generate([prompt], group_size=16)
    assert len(ids) == 16 and any(len(row) < 12 for row in ids) and len({len(row) for row in ids}) > 1
    for row in ids:
        assert not set(generator.stop_ids) & set(row[:-1])  # nothing is kept after a stop token
        assert len(row) == 12 or row[-1] in generator.stop_ids  # which is kept: the model learns to stop
    assert len(set(map(tuple, ids))) > 1  # sampled, not greedy
    assert texts == tokenizer.batch_decode(ids, skip_special_tokens=True)


def test_sampling_stops_at_the_end_of_a_stop_string_and_keeps_it(tiny_model_path):
    """``stop_strings`` (transformers' own criterion): a completion ends with the token that completes
    the text, and nothing before that token holds it; one without it ran to ``max_new_tokens``."""
    model, tokenizer = load(tiny_model_path)
    generator = generation.HFGenerator(
        model, tokenizer, max_new_tokens=16, stop_strings=["th"], learners=distributed.single_learner("cpu")
    )
    torch.manual_seed(0)
    ids, texts = generator.generate([tokenizer("Pick")["input_ids"]], group_size=16)
    stopped = [row for row in ids if "th" in tokenizer.decode(row)]
    assert stopped and len(stopped) < 16 and len({len(row) for row in stopped}) > 1
    for row in ids:
        end_of_turn = row[-1] in generator.stop_ids
        if "th" in tokenizer.decode(row):
            assert "th" not in tokenizer.decode(row[:-1])  # it ends with the token that completes the text
        else:
            assert len(row) == 16 or end_of_turn
    assert texts == tokenizer.batch_decode(ids, skip_special_tokens=True)


def test_logprobs_of_left_padded_prompts_equal_unpadded(tiny_model_path):
    model, _ = load(tiny_model_path)
    prompts = [[5, 6, 7, 8, 9], [11, 12]]
    completions = [[20, 21, 22], [30]]
    prompt_ids, prompt_mask = pad_rows(prompts, 0, left=True, device="cpu")
    completion_ids, completion_mask = pad_rows(completions, 0, left=False, device="cpu")
    assert prompt_mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    assert completion_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    with torch.no_grad():
        batched = grpo.completion_logprobs(
            model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), 3, 0.8
        )
        for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            ids = torch.tensor([prompt + completion])
            alone = grpo.completion_logprobs(model, ids, torch.ones_like(ids), len(completion), 0.8)[0]
            torch.testing.assert_close(batched[row, : len(completion)], alone, rtol=1e-5, atol=1e-5)


def test_each_request_samples_from_its_own_generator_alone_or_batched(tiny_model_path):
    """``sample_requests``, the service's sampler, here on this environment's transformers too: a
    seeded request's samples do not depend on what else is in its batch, nor on the global seed."""
    model, tokenizer = load(tiny_model_path)
    stop_ids = generation.default_stop_ids(model, tokenizer)
    ours = generation.SampleRequest([5, 6, 7, 8], num_samples=2, max_new_tokens=10, seed=4)
    others = [
        generation.SampleRequest([9] * 9, num_samples=3, max_new_tokens=16, temperature=0.7, top_p=0.9, seed=1),
        generation.SampleRequest([3], num_samples=1, max_new_tokens=4, top_k=5, seed=2),
        generation.SampleRequest([7, 7], num_samples=1, max_new_tokens=12, temperature=0.0),
    ]
    torch.manual_seed(0)
    (alone,) = generation.sample_requests(model, tokenizer, [ours], stop_ids)
    torch.manual_seed(1)
    batched = generation.sample_requests(model, tokenizer, [others[0], ours, *others[1:]], stop_ids)
    assert [s.tokens for s in batched[1]] == [s.tokens for s in alone]
    assert alone[0].tokens != alone[1].tokens  # sampled: the two rows drew differently
    for a, b in zip(alone, batched[1], strict=True):
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), rtol=1e-4, atol=1e-4)
    assert [len(s.tokens) for s in batched[2]] == [4]  # each request's own token limit
    assert all(len(s.tokens) == 16 or s.stop_reason == "stop" for s in batched[0])
    # The log-probs are those of the distribution drawn from: temperature and top-k applied.
    (top5,) = generation.sample_requests(model, tokenizer, [others[1]], stop_ids)
    with torch.no_grad():
        logits = model(torch.tensor([[3]])).logits[0, -1]
    allowed = torch.log_softmax(torch.topk(logits, 5).values, -1)
    assert any(abs(top5[0].logprobs[0] - value) < 1e-4 for value in allowed.tolist())


def test_a_stop_string_ends_the_sample_where_padding_is_the_end_of_turn_token(tiny_model_path):
    """Some models pad with their end-of-turn id (SmolLM2: both are <|im_end|>). A row ended by a stop
    string is padded after it; the sample must end at the stop string, not one padding token later with
    a log-prob nobody sampled."""
    model, tokenizer = load(tiny_model_path)
    end_of_turn = tokenizer.pad_token_id  # as the end-of-turn id here, as in SmolLM2
    requests = [
        generation.SampleRequest([5, 6, 7, 8], num_samples=4, max_new_tokens=40, seed=s, stop=["e"]) for s in range(4)
    ] + [generation.SampleRequest([9, 9], num_samples=1, max_new_tokens=40, temperature=0.0)]  # keeps the pass going
    answers = generation.sample_requests(model, tokenizer, requests, [end_of_turn])
    stopped = [s for samples in answers[:4] for s in samples if s.stop_reason == "stop"]
    assert len(stopped) >= 4, [s.tokens for samples in answers for s in samples]
    for sample in stopped:
        text = tokenizer.decode(sample.tokens)
        assert "e" in text and "e" not in tokenizer.decode(sample.tokens[:-1]), text  # the last token completes it
        ids = torch.tensor([[5, 6, 7, 8] + sample.tokens])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].float(), -1)
        expected = [logprobs[3 + i, t].item() for i, t in enumerate(sample.tokens)]
        torch.testing.assert_close(torch.tensor(sample.logprobs), torch.tensor(expected), rtol=1e-4, atol=1e-4)


def test_a_pass_drops_its_finished_rows_and_samples_the_same(tiny_model_path, monkeypatch):
    """``sample_requests`` calls ``generate`` every ``PRUNE_EVERY`` tokens on the rows still going, from
    the cache the previous call left: the batch shrinks as rows finish, and every sample (tokens and
    log-probs) is the one a single uninterrupted ``generate`` draws."""
    model, tokenizer = load(tiny_model_path)
    stop_ids = generation.default_stop_ids(model, tokenizer)
    requests = [
        generation.SampleRequest([5, 6, 7, 8], num_samples=3, max_new_tokens=5, seed=1),
        generation.SampleRequest([9] * 7, num_samples=2, max_new_tokens=23, temperature=0.8, top_k=20, seed=2),
        generation.SampleRequest([3, 4], num_samples=1, max_new_tokens=14, temperature=0.0),
    ]
    batch_sizes = []
    generate = model.generate

    def counted(**kwargs):
        batch_sizes.append(kwargs["input_ids"].size(0))
        return generate(**kwargs)

    monkeypatch.setattr(model, "generate", counted)
    monkeypatch.setattr(generation, "PRUNE_EVERY", 4)
    pruned = generation.sample_requests(model, tokenizer, requests, stop_ids)
    assert batch_sizes[0] == 6 and batch_sizes[-1] < 6 and batch_sizes == sorted(batch_sizes, reverse=True)
    assert len(batch_sizes) == 6  # ceil(23 / 4) calls: the longest request's limit, 4 tokens a call
    monkeypatch.setattr(generation, "PRUNE_EVERY", 1_000)
    whole = generation.sample_requests(model, tokenizer, requests, stop_ids)
    assert len(batch_sizes) == 7 and batch_sizes[-1] == 6  # one call, every row to the end
    for ours, theirs in zip(pruned, whole, strict=True):
        assert [s.tokens for s in ours] == [s.tokens for s in theirs]
        assert [s.stop_reason for s in ours] == [s.stop_reason for s in theirs]
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=1e-4, atol=1e-4)
    assert [len(s.tokens) for s in pruned[0]] == [5, 5, 5] or any(s.stop_reason == "stop" for s in pruned[0])
    assert all(len(s.tokens) <= 23 for s in pruned[1]) and len(pruned[2][0].tokens) <= 14
