"""Multi-turn scenarios run with the real SDK v3 (``.venv-sessions``), as ``sdk_scenarios.py`` runs its own:

    .venv-sessions/bin/python multi_turn_scenarios.py <scenario> '<json arguments>'

Each prints one JSON line last, which the test reads.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common.episodes import ChatTurns, run_episode
from sagemaker.train.training_session import ServiceClient

from helpers.training_sessions import datum_tools, grpo, tool_rl

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"


class OneToolCallThenAnswer:
    """The first turn calls a tool whose reply is fixed; the next turn is the answer: the bookkeeping of
    the episode is what is tested, not a tool."""

    def __init__(self):
        self.calls = 0

    def prompt_messages(self, example):
        return [{"role": "user", "content": example["question"]}]

    def tool_call(self, text):
        self.calls += 1
        return "run" if self.calls == 1 else None

    def run_tool(self, call):
        return "the tool printed 42", False


def episode_on_session(model: str, turns: int, stop: list[str]) -> dict:
    """Episodes sampled turn by turn on a session, trained at once with importance_sampling: what the
    sampler drew, what the datums train, and the first step's sampler_kl and clip_fraction."""
    service = ServiceClient(region="us-east-1", role_arn=ROLE)
    client = service.create_lora_training_client(model, rank=4, alpha=8)
    try:
        chat = ChatTurns(client.get_tokenizer())
        sampler = client.save_weights_and_get_sampling_client()
        drawn, episodes = [], []
        for index in range(4):
            sample, these = tool_rl.session_sampler(sampler, 1.0, tool_rl.episode_seed(0, 0, index), stop), []

            def recorded(tokens, room, sample=sample, these=these):
                turn = sample(tokens, room)
                these += turn[0]  # every token the sampler returned, turn after turn
                return turn

            episode = run_episode(
                {"question": "What is 6 times 7?"}, OneToolCallThenAnswer(), chat, recorded, turns, 1024
            )
            episodes.append(episode)
            drawn.append(these)
        datums = [tool_rl.episode_datum(e, advantage=1.0) for e in episodes]
        result = client.forward_backward(datums, loss_fn="importance_sampling").result()
        trained = [
            [
                t
                for t, w in zip(
                    datum_tools.values(d.loss_fn_inputs["target_tokens"]),
                    datum_tools.values(d.loss_fn_inputs["weights"]),
                    strict=True,
                )
                if w
            ]
            for d in datums
        ]
        tool_tokens = [
            sum(1 for s in e.sampled[e.prompt_length :] if not s) for e in episodes
        ]  # the tool turns' tokens, inside the datum, weight 0
        return {
            "drawn": drawn,
            "trained": trained,
            "tool_tokens": tool_tokens,
            "turns": [len(e.turns) for e in episodes],
            "end_reasons": [e.end_reason for e in episodes],
            **grpo.training_record(datums, result),
        }
    finally:
        client.stop()


class _Recorder(BaseHTTPRequestHandler):
    """A local HTTP server standing in for two services: the model (OpenAI's chat completions, answering
    the next scripted turn) and SageMaker's RFT runtime (complete-rollout, update-reward). It records
    each request's path, headers and body."""

    script: list[str] = []
    seen: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path.endswith("/chat/completions"):
            text = self.script.pop(0)
            answer = {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            }
        else:
            answer = {}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def rft_rollout(turns: list[str], max_turns: int, program_limits: dict | None = None) -> dict:
    """Notebook 15's rollout handler, given a RolloutRequest's payload as the training job sends it: the
    model's turns are scripted, the tool is the real sandbox, the feedback goes through the SDK's own
    RolloutFeedbackClient to a local server that records it."""
    from sandbox import Limits, Sandbox

    from helpers.training_sessions.rft_rollout import rollout_handler

    _Recorder.script, _Recorder.seen = list(turns), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    payload = {
        "instance": {"question": "What is 6 times 7?", "answer": "6 * 7 = 42\n#### 42"},
        "metadata": {
            "job_arn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/rft-local",
            "trajectory_id": "trajectory-1",
            "endpoint": url,
            "region": "us-east-1",
        },
        "inference_params": {"temperature": 0.7, "max_tokens": 64},
        "model_endpoint": f"{url}/v1",
        "model_name": "the-model-being-trained",
    }
    try:
        from environments.python_tool import PythonToolEnvironment

        with Sandbox(workers=1, limits=Limits(**(program_limits or {}))) as sandbox:
            result = rollout_handler(PythonToolEnvironment(sandbox=sandbox), max_turns)(payload)
    finally:
        server.shutdown()
    return {"result": result, "seen": _Recorder.seen}


if __name__ == "__main__":
    scenario, arguments = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps({"episode_on_session": episode_on_session, "rft_rollout": rft_rollout}[scenario](**arguments)))
