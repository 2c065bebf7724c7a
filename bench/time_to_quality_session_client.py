"""The training-session side of ``bench.time_to_quality``, run with ``.venv-sessions/bin/python`` (SDK v3).

    time_to_quality_session_client.py <config.json>

A GRPO step through the SDK, built from ``helpers.training_sessions``' functions (sample a group per problem, score
with the GSM8K checker, policy-gradient datums, AdamW) with the settings every side of the benchmark
shares: advantages divided by the group's std, the loss a mean over the step's completion tokens (flat
groups included, as grpo.py and TRL count them), samples cut to ``max_new_tokens``. The loop here is
only the benchmark's clock and evaluation around those calls. Prints one JSON line: the curve of
(step, training seconds, held-out accuracy), the step the target was reached at, the seconds spent in
evaluations, the mean completion length and this process's peak RSS.
"""

import contextlib
import json
import random
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from common.advantages import group_advantages  # scripts/common: helpers.training_sessions puts scripts/ on the path
from environments.gsm8k import GSM8KEnvironment
from sagemaker.train.training_session import SamplingParams, ServiceClient

from helpers.training_sessions import connect, datum_tools
from helpers.training_sessions import grpo as session_grpo


def cut(tokenizer, groups: list[dict], max_tokens: int) -> list[dict]:
    """Each sample's first ``max_tokens`` tokens (and their logprobs), decoded again: what a sampler
    capped at ``max_tokens`` draws, since every token depends only on those before it. Each group
    also keeps how many tokens the service generated (``generated``), the cut ones included."""
    for group in groups:
        group["generated"] = sum(len(sample.tokens) for sample in group["samples"])
        group["samples"] = [
            sample.model_copy(
                update={"tokens": sample.tokens[:max_tokens], "logprobs": (sample.logprobs or [])[:max_tokens]}
            )
            for sample in group["samples"]
        ]
        group["completions"] = [tokenizer.decode(s.tokens, skip_special_tokens=True) for s in group["samples"]]
    return groups


def held_out_accuracy(runtime, session_name: str, env, held_out: list[dict], max_tokens: int) -> float:
    """Greedy answers from the session's model as it is now, scored by the checker. They come from the
    chat operation (SampleTrainingSession), which takes a ``max_tokens`` below the sample operation's
    512-token floor, so each answer is capped at ``max_tokens`` as the other sides' evaluations are (its
    greedy answer is token for token the sample operation's: tests/training_sessions/test_session_chat.py).
    Through ``sample`` they would run to 512 tokens or the end of turn, minutes an evaluation."""

    def answer(problem: dict) -> str:
        body = {"messages": env.prompt_messages(problem), "max_tokens": max_tokens, "temperature": 0}
        response = runtime.sample_training_session(
            trainingSessionName=session_name, contentType="application/json", body=json.dumps(body).encode()
        )
        return json.loads(response["body"].read())["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(max_workers=8) as pool:  # in flight together, so the service can share passes
        answers = list(pool.map(answer, held_out))
    return sum(bool(s["correct"]) for s in env.score(held_out, answers)) / len(held_out)


def main(config: dict) -> dict:
    env = GSM8KEnvironment()
    service = ServiceClient(region="us-east-1", role_arn=connect.LOCAL_ROLE)
    rng = random.Random(config["seed"])
    group_size, max_tokens = config["group_size"], config["max_new_tokens"]
    adam = connect.adam_params(config["learning_rate_lora"])
    curve, reached, trained, eval_seconds, lengths = [], None, 0.0, 0.0, []
    answer_lengths, step_profile = [], []  # every trained answer's length; each step's phases, as the client sees them

    with contextlib.ExitStack() as stop:
        training_client = connect.open_session(
            service, config["model"], config["lora_rank"], config["lora_alpha"], seed=config["seed"]
        )
        stop.callback(connect.close_session, training_client)
        tokenizer = training_client.get_tokenizer()
        runtime = boto3.client("sagemakertrainingsessionruntime", region_name="us-east-1")

        def evaluate(step: int) -> None:
            nonlocal reached, eval_seconds
            if not config["session_evaluations"]:  # a run for the step profile only
                return
            started = time.perf_counter()
            accuracy = held_out_accuracy(
                runtime, training_client.training_session_name, env, config["held_out"], config["eval_max_new_tokens"]
            )
            eval_seconds += time.perf_counter() - started
            curve.append({"step": step, "seconds": round(trained, 3), "accuracy": accuracy})
            if accuracy >= config["target"] and reached is None:
                reached = curve[-1]

        evaluate(0)
        for step in range(1, config["max_steps"] + 1):
            started, wall_start = time.perf_counter(), time.time()
            sampler = training_client.save_weights_and_get_sampling_client()
            saved = time.perf_counter()
            params = SamplingParams(
                max_tokens=512,
                temperature=config["temperature"],
                seed=config["seed"] * 1_000_000 + step * 1_000,
                stop=config["session_stop"],
            )
            batch = rng.sample(config["train"], config["prompts_per_step"])
            groups = session_grpo.receive_groups(
                tokenizer, session_grpo.sample_groups(sampler, tokenizer, env, batch, group_size, params)
            )
            sampled = time.perf_counter()
            session_grpo.score_groups(env, cut(tokenizer, groups, max_tokens), config["format_reward_weight"])
            samples = [(g["prompt"], s) for g in groups for s in g["samples"]]
            advantages = [
                a for g in groups for a in group_advantages([s["reward"] for s in g["scores"]], group_size, "group")
            ]
            n_tokens = max(sum(len(s.tokens) for _, s in samples), 1)
            lengths.append(n_tokens / len(samples))
            datums = [
                datum_tools.policy_gradient_datum(prompt, sample, advantage / n_tokens)
                for (prompt, sample), advantage in zip(samples, advantages, strict=True)
                if advantage != 0.0  # a zero advantage adds nothing to the gradient
            ]
            answer_lengths += [len(s.tokens) for _, s in samples]
            scored = time.perf_counter()
            if datums:
                forward_backward = training_client.forward_backward(datums, loss_fn="importance_sampling")
                optim_step = training_client.optim_step(adam)
                forward_backward.result()
                fb_done = time.perf_counter()
                optim_step.result()
            ended = time.perf_counter()
            trained += ended - started
            step_profile.append(
                {
                    "step": step,
                    "wall": [wall_start, time.time()],  # to find the service's phases of this step
                    "save": saved - started,
                    "sample": sampled - saved,
                    "score_and_datums": scored - sampled,
                    "forward_backward": (fb_done - scored) if datums else 0.0,
                    "optim_step": (ended - fb_done) if datums else 0.0,
                    "total": ended - started,
                    "generated_tokens": sum(g["generated"] for g in groups),
                    "trained_tokens": sum(len(s.tokens) for _, s in samples),
                    "datums": len(datums),
                }
            )
            if step % config["eval_every"] == 0 or step == config["max_steps"]:
                evaluate(step)
                if reached is not None:
                    break
    return {
        "curve": curve,
        "reached_at": reached,
        "trained_seconds": trained,
        "eval_seconds": eval_seconds,
        "completion_length": sum(lengths) / len(lengths) if lengths else None,
        "answer_lengths": answer_lengths,
        "step_profile": step_profile,
        "client_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        print(json.dumps(main(json.load(handle))))
