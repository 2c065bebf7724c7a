"""Multi-turn RL with a tool on a session (notebook 15): episodes sampled turn by turn, scored, and
turned into datums; the step itself is the notebook's cell, as in 08.

An episode (``common/episodes.py``, which the job scripts import too) is one token sequence that only
grows: the prompt, the model's turn as the sampler drew it, the tool's reply as a tool turn of the chat
template, the model's next turn, ... up to ``max_turns`` sampled turns. The environment
(``environments/python_tool.py``) decides what a turn asks the tool, runs it in the sandbox and scores the
final ``#### n``. What 08's GRPO step does with a group of answers, this module does with a group of
episodes, reusing 08's pieces (``grpo.draw_problems``, ``grpo.training_record``, ``grpo.held_out_record``)
and the job scripts' advantage function:

  1. ``sample_episodes``: ``group_size`` episodes per problem, every episode in flight at once, each of
     its turns one sample request on the session's sampler (``session_sampler``);
  2. ``score_groups``: the environment's reward of each episode (0 for one the turn cap or the context
     stopped, with its counted reason);
  3. ``policy_gradient_datums``: each episode's reward minus its group's mean (Dr. GRPO), on the model's
     tokens of every turn; 0 on the prompt's and the tool's (``episode_datum``).

``warmup_episodes`` turns worked answers into episodes a tool user would write (GSM8K's calculator
annotations become a program), for a few supervised steps when the base model has never seen the tool.
"""

from __future__ import annotations

import contextlib
import zlib
from concurrent.futures import ThreadPoolExecutor

from common import stats
from common.advantages import group_advantages, is_flat
from common.episodes import END_REASONS, ChatTurns, Episode, policy_gradient_inputs, replay_episode, run_episode

from helpers.training_sessions import grpo

MAX_TOKENS = grpo.MAX_TOKENS  # the service's smallest maxTokens; a turn ends earlier at its end of turn


@contextlib.contextmanager
def tool_environment(workers: int = 2, self_test: bool = True, **options):
    """The Python-tool environment with a sandbox of ``workers`` fork servers on this machine, attacked
    with hostile programs first (``self_test``: it raises if one got out); stopped on the way out.
    ``options`` go to ``PythonToolEnvironment`` (``reply_chars``, the shaping penalties)."""
    from environments.python_tool import PythonToolEnvironment
    from sandbox import Sandbox, run_selftest

    with Sandbox(workers=workers) as sandbox:
        if self_test:
            run_selftest(sandbox, log=lambda line: None)
        print(sandbox.describe())
        yield PythonToolEnvironment(sandbox=sandbox, **options)


def episode_seed(seed: int, step: int, index: int) -> int:
    """Episode ``index`` of step ``step``'s seed, a function of (seed, step, index) alone, within the
    service's 32-bit seeds; its turns add 0, 1, 2... (room for 64 turns)."""
    return zlib.crc32(f"{seed}:{step}:{index}".encode()) % 2**25 * 64


def session_sampler(sampling_client, temperature: float, seed: int, stop: list[str] | None = None):
    """``run_episode``'s sample function on a session: turn t is one sample request with seed
    ``seed + t``. The service takes at least ``MAX_TOKENS`` new tokens a request, so a turn that runs past
    the room its episode has left is cut there, as a request for exactly that room would have stopped
    (the tokens and log-probs before the cut are the same), and reported as stopped by its length."""
    from sagemaker.train.training_session import SamplingParams

    turns = iter(range(64))

    def sample(tokens: list[int], room: int) -> tuple[list[int], list[float], str]:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=seed + next(turns), stop=stop)
        (drawn,) = sampling_client.sample(tokens, num_samples=1, sampling_params=params).result().sequences
        if len(drawn.tokens) > room:
            return list(drawn.tokens[:room]), list(drawn.logprobs[:room]), "length"
        return list(drawn.tokens), list(drawn.logprobs), drawn.stop_reason.value

    return sample


def sample_episodes(
    sampling_client,
    chat: ChatTurns,
    env,
    problems: list[dict],
    group_size: int,
    max_turns: int,
    context: int,
    temperature: float,
    seed: int,
    step: int,
    stop: list[str] | None = None,
) -> list[dict]:
    """``group_size`` episodes per problem, all in flight at once (a thread each: an episode's turns
    follow one another, episodes do not wait for each other, and the service batches what arrives
    together). Returns one group per problem: ``{"problem", "episodes"}``."""
    jobs = [(problem, i * group_size + k) for i, problem in enumerate(problems) for k in range(group_size)]

    def run(job) -> Episode:
        problem, index = job
        sample = session_sampler(sampling_client, temperature, episode_seed(seed, step, index), stop)
        return run_episode(problem, env, chat, sample, max_turns, context)

    with ThreadPoolExecutor(max_workers=min(len(jobs), 64)) as pool:
        episodes = list(pool.map(run, jobs))
    return [
        {"problem": problem, "episodes": episodes[i * group_size : (i + 1) * group_size]}
        for i, problem in enumerate(problems)
    ]


def score_groups(env, groups: list[dict], format_reward_weight: float = 0.0) -> list[dict]:
    """Each group gets ``scores`` (the environment's, one per episode: reward, correct, format reward,
    tool calls and failures, turns, end reason) and ``rewards`` (reward + ``format_reward_weight`` x
    format reward)."""
    examples = [g["problem"] for g in groups for _ in g["episodes"]]
    scores = iter(env.score_episodes(examples, [e for g in groups for e in g["episodes"]]))
    for group in groups:
        group["scores"] = [next(scores) for _ in group["episodes"]]
        group["rewards"] = [s["reward"] + format_reward_weight * s["format_reward"] for s in group["scores"]]
    return groups


def episode_datum(episode: Episode, advantage: float | None = None):
    """One episode as a datum. With an ``advantage``: importance_sampling / ppo's inputs, weight 1, the
    sampler's log-prob and the advantage on the model's tokens of every turn, 0 on the prompt's and the
    tool's. Without: cross_entropy's, the same weights (a demonstration: the model learns its turns only)."""
    from sagemaker.train.training_session import Datum, ModelInput

    inputs = policy_gradient_inputs(episode, 0.0 if advantage is None else advantage)
    keep = ("target_tokens", "weights") if advantage is None else ("target_tokens", "weights", "logprobs", "advantages")
    return Datum(model_input=ModelInput.from_ints(inputs["model_input"]), loss_fn_inputs={k: inputs[k] for k in keep})


def policy_gradient_datums(groups: list[dict], group_size: int) -> tuple[list, int]:
    """Each episode's advantage, its reward minus its group's mean (``group_advantages``, Dr. GRPO as in
    08), divided by the step's sampled tokens (the service sums: this makes its loss a mean over the
    model's tokens), and its datum. Groups whose episodes all scored the same teach nothing and are
    skipped. Returns the datums and the number of groups skipped."""
    taught, skipped = [], 0
    for group in groups:
        if is_flat(group["rewards"]):
            skipped += 1
            continue
        advantages = group_advantages(group["rewards"], group_size, scale_rewards="none")
        taught += list(zip(group["episodes"], advantages, strict=True))
    n_tokens = sum(episode.sampled_tokens for episode, _ in taught)
    return [episode_datum(episode, advantage / n_tokens) for episode, advantage in taught], skipped


def tool_use(scores: list[dict]) -> dict[str, float]:
    """The curves of notebook 15, per episode: tool calls, tool errors (a call that failed, a limit hit,
    a refused program), sampled turns, the share with a final ``#### n`` line, and the share each reason
    other than "answered" ended (``END_REASONS``: the turn cap, the context, a turn cut at its length)."""
    n = len(scores)
    record = {
        "tool_calls_per_answer": sum(s["tool_calls"] for s in scores) / n,
        "tool_errors_per_answer": sum(s["tool_failures"] for s in scores) / n,
        "turns_per_answer": sum(s["turns"] for s in scores) / n,
        "final_format": sum(s["format_reward"] for s in scores) / n,
    }
    for reason in END_REASONS[1:]:
        record[f"ended_{reason}"] = sum(s["end_reason"] == reason for s in scores) / n
    return record


def step_record(env, groups: list[dict], skipped_groups: int) -> dict:
    """A step's metrics: mean reward and accuracy of its episodes, the groups skipped (all rewards equal),
    the model's sampled tokens, ``tool_use``, and the environment's ``step_metrics()`` (tool calls run and
    the share that failed)."""
    scores = [s for g in groups for s in g["scores"]]
    return {
        "reward": sum(r for g in groups for r in g["rewards"]) / len(scores),
        "accuracy": sum(bool(s["correct"]) for s in scores) / len(scores),
        "skipped_groups": skipped_groups,
        "sampled_tokens": sum(e.sampled_tokens for g in groups for e in g["episodes"]),
        **tool_use(scores),
        **env.step_metrics(),
    }


def evaluate(
    sampling_client,
    chat: ChatTurns,
    env,
    problems: list[dict],
    samples_per_problem: int,
    temperature: float,
    max_turns: int,
    context: int,
    seed: int = 12345,
    stop: list[str] | None = None,
) -> dict:
    """Held-out accuracy with the tool: ``samples_per_problem`` episodes a problem, the same seeds every
    time it is called (two models meet the same random draws), in ``grpo.evaluate``'s shape (accuracy, its
    standard error over problems, ``per_problem`` for the paired change, ``answer_diversity``), plus
    ``tool_use`` and the share of tool calls that failed."""
    groups = score_groups(
        env,
        sample_episodes(
            sampling_client, chat, env, problems, samples_per_problem, max_turns, context, temperature, seed, -1, stop
        ),
    )
    answers = [
        stats.given_answer(env.answer_text(e), s)
        for g in groups
        for e, s in zip(g["episodes"], g["scores"], strict=True)
    ]
    return {
        **grpo.held_out_result(groups, answers, samples_per_problem),
        **tool_use([s for g in groups for s in g["scores"]]),
        "tool_failure_rate": env.step_metrics()["tool_failure_rate"],  # and the count starts again for the loop
        "first_episode": groups[0]["episodes"][0],
    }


def without_tool(
    sampling_client,
    tokenizer,
    env,
    problems: list[dict],
    samples_per_problem: int,
    temperature: float,
    seed: int = 12345,
) -> dict:
    """The same held-out problems answered in one turn, without the tool: the task's own environment and
    prompt (``env.single_turn``), the same checker and seeds, in ``grpo.evaluate``'s shape. A program ends
    at its closing fence, as in notebook 09."""
    stop = None if env.task == "gsm8k" else ["\n```\n"]
    result = grpo.evaluate(
        sampling_client, tokenizer, env.single_turn, problems, samples_per_problem, temperature, stop=stop, seed=seed
    )
    env.step_metrics()  # these programs are not the loop's
    return result


def show_episode(tokenizer, episode: Episode) -> str:
    """An episode after its prompt, as the trainer sees it: each run of sampled tokens (weight 1) and of
    tool-turn tokens (weight 0), labelled, with how it ended."""
    parts, start = [], episode.prompt_length
    for end in range(episode.prompt_length + 1, len(episode.tokens) + 1):
        if end == len(episode.tokens) or episode.sampled[end] != episode.sampled[start]:
            label = "model, trained" if episode.sampled[start] else "tool turn, weight 0"
            parts.append(f"[{label}] {tokenizer.decode(episode.tokens[start:end])!r}")
            start = end
    return "\n".join(parts + [f"[ended] {episode.end_reason}"])


# --------------------------------------------------------------------------- warm-up demonstrations


def warmup_episodes(env, chat: ChatTurns, examples: list[dict], context: int) -> list[Episode]:
    """Each example's ``demonstration`` (``environments/python_tool.py``) replayed as if the model had
    written it, the tool's real reply included. ``episode_datum(episode)`` makes it a cross_entropy datum
    (weight 1 on the demonstrated turns, 0 on the prompt and the tool's reply). A demonstration that does
    not fit the context is left out."""
    from environments.python_tool import demonstration

    episodes = [replay_episode(example, env, chat, demonstration(example), context) for example in examples]
    episodes = [e for e in episodes if e.end_reason == "answered"]
    env.step_metrics()  # the demonstrations' tool calls are not the loop's
    return episodes
