"""Notebook 15's agent as a rollout handler of SageMaker's managed multi-turn RL (SDK v3's
``sagemaker.train.rft``).

There the training job owns the loop and the model; the agent is a service of your own. For each rollout
the job POSTs a ``RolloutRequest`` (the problem, the rollout's metadata, sampling parameters); the agent
calls the model being trained over an OpenAI-compatible endpoint with the **inference headers** that tie
each call to the rollout (``make_inference_headers``: the job's ARN and the trajectory's id), and reports
the rollout's end and reward (``RolloutFeedbackClient``, which ``sagemaker_rft_handler`` calls with the
``reward`` the handler returns, or ``report_error`` when it raises).

The environment is notebook 15's, unchanged: the same tool call detection, the same sandbox, the same
checker and end reasons. Over a chat endpoint the agent sends and receives text, so keeping the trained
tokens equal to the sampled ones is the service's business there, not the agent's. The tool's reply goes
back as a user message: a chat API's ``tool`` role needs a function call to answer, and this tool is a
fenced block in the answer's text.
"""

from __future__ import annotations

from common.episodes import Episode


def rollout_handler(env, max_turns: int, model_endpoint: str | None = None, api_key: str = "unused"):
    """A handler for ``POST /rollout`` (or an AgentCore entrypoint): takes the request's payload (a dict in
    ``RolloutRequest``'s shape), plays one episode of at most ``max_turns`` model turns and returns its
    score; ``sagemaker_rft_handler`` reports the reward. ``model_endpoint`` is the OpenAI-compatible base
    URL used when the request names none."""
    from openai import OpenAI
    from sagemaker.train.rft import InferenceParams, RolloutRequest, make_inference_headers, sagemaker_rft_handler

    @sagemaker_rft_handler
    def rollout(payload: dict) -> dict:
        request = RolloutRequest.model_validate(payload)  # the SDK's contract: a bad request fails here, named
        endpoint = request.model_endpoint or model_endpoint
        if not endpoint:
            raise ValueError("The rollout request names no model_endpoint and the handler has none: pass one.")
        model = OpenAI(base_url=endpoint, api_key=api_key, default_headers=make_inference_headers(request.metadata))
        sampling = (request.inference_params or InferenceParams()).model_dump(exclude_none=True)
        messages = env.prompt_messages(request.instance)
        turns, replies, failures, end_reason = [], [], 0, "turn_cap"
        for turn in range(max_turns):
            (choice,) = model.chat.completions.create(
                model=request.model_name or "default", messages=messages, **sampling
            ).choices
            text = choice.message.content or ""
            turns.append(text)
            messages.append({"role": "assistant", "content": text})
            if choice.finish_reason == "length":
                end_reason = "length"
                break
            call = env.tool_call(text)
            if call is None:
                end_reason = "answered"
                break
            if turn == max_turns - 1:
                break  # the turn cap: no turn is left to read the reply
            reply, failed = env.run_tool(call)
            replies.append(reply)
            failures += bool(failed)
            messages.append({"role": "user", "content": f"The tool printed:\n{reply}"})
        episode = Episode([], [], [], 0, turns, replies, failures, end_reason)
        (score,) = env.score_episodes([request.instance], [episode])
        return {key: score[key] for key in ("reward", "correct", "end_reason", "tool_calls", "tool_failures", "turns")}

    return rollout
