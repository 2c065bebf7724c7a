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
    batched_ids, batched_texts = generator.generate(prompts, num_generations=2, greedy=True)
    assert len(batched_ids) == 6
    for index, prompt in enumerate(prompts):
        alone_ids, alone_texts = generator.generate([prompt], num_generations=1, greedy=True)
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
    ids, texts = generator.generate([prompt], num_generations=16)
    assert len(ids) == 16 and any(len(row) < 12 for row in ids) and len({len(row) for row in ids}) > 1
    for row in ids:
        assert not set(generator.stop_ids) & set(row[:-1])  # nothing is kept after a stop token
        assert len(row) == 12 or row[-1] in generator.stop_ids  # which is kept: the model learns to stop
    assert len(set(map(tuple, ids))) > 1  # sampled, not greedy
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
