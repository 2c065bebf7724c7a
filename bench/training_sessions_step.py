"""One GRPO step of bench.time_to_quality's session side, in-process on the session engine, as it is or
as it was before the step was profiled (``--before``): for farm-bench's paired before/after runs.

    python -m bench.training_sessions_step [--before] [--model smollm2|tiny]
    farm-bench -n 5 --timeout 1800 -- .venv/bin/python -m bench.training_sessions_step \
        --vs '.venv/bin/python -m bench.training_sessions_step --before'

The step: a saved adapter merged for sampling, 4 GSM8K problems x 6 answers at temperature 1 in one
shared pass, each ending at its first line (notebook 8's stop) or the service's 512 tokens, cut to 24
tokens; their policy-gradient datums (random advantages, fixed seed) through ``forward_backward``
(importance_sampling) and ``optim_step``. The same seeds every run, hence the same samples and datums.
``--before`` puts back what the profile's changes replaced: each sample's row reads its prompt
(no ``shared_prompt_prefill``), a deep copy of the model merged per saved adapter, datums in passes in
the order sent. Prints each phase's wall and CPU seconds, and the peak RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import random
import time

import torch

from bench.tables import peak_rss_mib

PROBLEMS, GROUP, CAP, STOP = 4, 6, 24, ["\n"]


def old_merge(engine, adapter):
    """The merge before: a deep copy of the model per saved adapter, merged by peft."""
    from local_mode.session_service import engine as engine_module

    engine.merged_sampler = None
    engine_module.return_freed_memory(collect=True)
    model = copy.deepcopy(engine.model)
    engine_module._set_peft_state(model, adapter)
    return model.merge_and_unload().eval()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", action="store_true")
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from common.data import prompt_token_ids
    from environments.gsm8k import GSM8KEnvironment
    from peft import get_peft_model_state_dict

    from local_mode.session_service import engine as engine_module

    if args.before:
        engine_module.shared_prompt_prefill = lambda model: contextlib.nullcontext()
        engine_module.Engine._merge_for_sampling = old_merge
        engine_module.length_order = lambda parsed: list(range(len(parsed)))
    if args.model == "tiny":
        from local_mode.tiny_model import tiny_model_dir

        path = tiny_model_dir()
    else:
        from local_mode import offline_models

        path = offline_models.smollm2_dir()
    from bench.time_to_quality import PROFILES, problems

    _, train, _ = problems(PROFILES["smollm2"])
    engine = engine_module.Engine(str(path), rank=16, alpha=32, seed=0)
    with torch.no_grad():  # an adapter that has trained a little: B is zero at initialisation
        for _, param in engine.named_trainable:
            param.normal_(0.0, 0.01)
    env, rng = GSM8KEnvironment(), random.Random(0)
    prompts = [prompt_token_ids(engine.tokenizer, env.prompt_messages(p)) for p in train[:PROBLEMS]]
    phases, cpu = {}, {}  # wall seconds, and this process's CPU seconds (what a shared machine leaves steady)

    def timed(name, function):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = function()
        phases[name] = round(time.perf_counter() - started, 3)
        cpu[name] = round(time.process_time() - cpu_started, 3)
        return result

    for round_ in range(2):  # two saved adapters: the second merge is a step's (the first builds the sampler)
        adapter = {k: v.clone() * (1 + round_) for k, v in get_peft_model_state_dict(engine.model).items()}
        engine.merged_sampler = (adapter, timed(f"merge {round_ + 1}", lambda: engine._merge_for_sampling(adapter)))  # noqa: B023
    params = {"maxTokens": 512, "temperature": 1.0, "stop": STOP}
    results = [None] * PROBLEMS

    def sample_all():
        import threading

        def one(index):
            results[index] = engine.sample(prompts[index], GROUP, dict(params, seed=index), adapter)

        with engine.lock:  # all four wait, then run in one pass
            threads = [threading.Thread(target=one, args=(i,)) for i in range(PROBLEMS)]
            for thread in threads:
                thread.start()
            while len(engine.sampling.pending) < PROBLEMS:
                time.sleep(0.005)
        for thread in threads:
            thread.join()

    timed("sample pass", sample_all)
    generated = sum(len(s["tokens"]) for group in results for s in group)
    datums = []
    for prompt, group in zip(prompts, results, strict=True):
        for sample in group:
            tokens, logprobs = sample["tokens"][:CAP], sample["logprobs"][:CAP]
            ids = prompt + tokens
            n = len(prompt) - 1
            advantage = rng.uniform(-1, 1) / 500
            datums.append(
                {
                    "modelInput": {"chunks": [{"tokens": ids[:-1], "type": "encoded_text"}]},
                    "lossFnInputs": {
                        "target_tokens": {"data": ids[1:], "dtype": "int64"},
                        "weights": {"data": [0.0] * n + [1.0] * len(tokens), "dtype": "float32"},
                        "logprobs": {"data": [0.0] * n + logprobs, "dtype": "float32"},
                        "advantages": {"data": [0.0] * n + [advantage] * len(tokens), "dtype": "float32"},
                    },
                }
            )
    result = timed("forward_backward", lambda: engine.forward_backward("importance_sampling", datums, {}, True))
    timed("optim_step", lambda: engine.optim_step({"learningRate": 5e-4, "gradClipNorm": 1.0}))
    report = {
        "before": args.before,
        "seconds": phases,
        "cpu_seconds": cpu,
        "generated_tokens": generated,
        "trained_tokens": sum(min(len(s["tokens"]), CAP) for g in results for s in g),
        "loss": result[0]["metrics"]["loss:sum"],
        "first_tokens": results[0][0]["tokens"][:8],
        "peak_rss_mib": round(peak_rss_mib() or 0),
    }
    print(json.dumps(report), flush=True)
    return report


if __name__ == "__main__":
    main()
