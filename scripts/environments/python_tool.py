"""A Python tool: the model may run a program in the sandbox, read what it printed, and answer.

A turn that holds a closed ```python block and no final ``####`` line calls the tool: the sandbox runs
the block under code RL's limits (``sandbox.Sandbox``: CPU and wall time, memory, output, no files, no
network, no processes), and what it printed, or the error, or the limit it hit, comes back as a tool
turn. Any other turn is the final answer. ``common/episodes.py`` runs the turns, token in and token out.

Two tasks (``task``), one tool:
- ``"gsm8k"``: word problems; the final answer ends with ``#### <n>``, scored by the GSM8K checker
  (``environments/gsm8k.py``);
- ``"functions"``: functions to complete, as HumanEval poses them (notebook 0's ``functions`` set); the
  model may try its function in the tool (define it, print a call) before it answers with a ``#### done``
  line. Its answer is the last program it wrote: the final turn's, or else the last one it ran. The code
  judge (``environments/code.py``) runs it against the problem's tests in the same sandbox: the reward
  is the share of tests passed, ``correct`` that all passed.

Rewards, per episode:
- answered: the task's reward and ``format_reward`` (the final ``####`` line);
- stopped at the turn cap or by the context: 0, with the reason in ``end_reason``;
- shaping, off by default: ``tool_error_penalty`` per failed tool call, ``tool_call_cost`` per call.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter

from .gsm8k import GSM8KEnvironment, has_final_line

TASKS = ("gsm8k", "functions")
SYSTEM_PROMPT = (
    "You are a helpful assistant with a Python tool. To compute something, write one ```python code "
    "block that prints the result, and stop: its output comes back to you. When you know the answer, end "
    "with '#### <answer>'."
)
FUNCTIONS_SYSTEM_PROMPT = (
    "You are an expert Python programmer with a Python tool. Write the function in one ```python code "
    "block; to try it, print a call in the same block and stop: what it prints comes back to you. When the "
    "function is right, end with the line '#### done'. Your answer is the last function you wrote."
)
_DONE_LINE = re.compile(r"^\s*####", re.MULTILINE)  # the functions task's final line: '#### done'
_PYTHON_BLOCK = re.compile(r"```python[^\n]*\n(.*?)```", re.DOTALL)
_CALCULATION = re.compile(r"<<([^=<>]+)=[^<>]*>>")  # GSM8K's calculator annotation: <<48/2=24>>
# What the model reads when a call fails, by the sandbox's verdict: what happened, never the machinery.
STOPPED = {
    "time_limit": "Stopped: the program ran past its time limit of {time:g} s.",
    "memory_limit": "Stopped: the program used more than its {memory} MB of memory.",
    "output_limit": "Stopped: the program printed more than the tool reads.",
    "sandbox_violation": "Stopped: the program tried what the tool does not allow (files, network, processes).",
    "judge_error": "The tool could not run the program.",
}


def demonstration(example: dict) -> list[str]:
    """The turns a tool user would write for an example. GSM8K: its worked answer's calculator annotations
    (``<<48/2=24>>``) as one program that prints each calculation, then ``#### <answer>``; a worked answer
    without a calculation is the final line alone. Functions: the reference function with a printed call
    on its first test's arguments, then ``#### done``. Played through ``common.episodes.replay_episode``,
    the tool's real reply lands between the two."""
    if "fn_name" in example:
        arguments = ", ".join(repr(a) for a in json.loads(example["tests"][0]["input"]))
        program = (
            f"{example['starter_code']}{example['canonical_solution']}\n\nprint({example['fn_name']}({arguments}))"
        )
        return [f"```python\n{program}\n```", "#### done"]
    final = "#### " + example["answer"].split("####")[-1].strip()
    calculations = _CALCULATION.findall(example["answer"])
    if not calculations:
        return [final]
    program = "\n".join(f"print({c.strip()})" for c in calculations)
    return [f"```python\n{program}\n```", final]


class PythonToolEnvironment:
    """The GSM8K problems with a Python tool (see the module docstring). ``sandbox`` is a started
    ``sandbox.Sandbox`` (its limits are the tool's), or None to start one at the first call."""

    name = "python_tool"

    def __init__(
        self,
        sandbox=None,
        task: str = "gsm8k",
        reply_chars: int = 600,
        tool_error_penalty: float = 0.0,
        tool_call_cost: float = 0.0,
    ):
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        if reply_chars < 1 or tool_error_penalty < 0 or tool_call_cost < 0:
            raise ValueError(
                f"reply_chars ({reply_chars}) must be >= 1, and tool_error_penalty ({tool_error_penalty}) and "
                f"tool_call_cost ({tool_call_cost}) >= 0 (0: no shaping)"
            )
        self._sandbox, self.task, self.reply_chars = sandbox, task, reply_chars
        self.tool_error_penalty, self.tool_call_cost = tool_error_penalty, tool_call_cost
        self.gsm8k = GSM8KEnvironment()
        self._code = None  # the functions task's judge, on this tool's sandbox (``single_turn``)
        self._lock = threading.Lock()
        self._verdicts: Counter[str] = Counter()  # since the last step_metrics()

    @property
    def sandbox(self):
        with self._lock:
            if self._sandbox is None:
                from sandbox import Sandbox

                self._sandbox = Sandbox(workers=1).start()
            return self._sandbox

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()

    @property
    def single_turn(self):
        """The task's environment without the tool, for the comparison "without the tool": GSM8K's, or
        the code environment judging in this tool's sandbox."""
        if self.task == "gsm8k":
            return self.gsm8k
        with self._lock:
            if self._code is None:
                from .code import CodeEnvironment, local_judge

                self._code = CodeEnvironment(judge=lambda items, mode: local_judge(self.sandbox)(items, mode))
            return self._code

    def load(self, path) -> list[dict]:
        return self.single_turn.load(path)

    def prompt_messages(self, example: dict) -> list[dict]:
        if self.task == "gsm8k":
            return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": example["question"]}]
        question = self.single_turn.prompt_messages(example)[-1]["content"]
        return [{"role": "system", "content": FUNCTIONS_SYSTEM_PROMPT}, {"role": "user", "content": question}]

    def is_final(self, text: str) -> bool:
        """Whether a turn ends with the task's final line: ``#### <n>`` (gsm8k), ``#### done`` (functions)."""
        return has_final_line(text) if self.task == "gsm8k" else _DONE_LINE.search(text) is not None

    def tool_call(self, text: str) -> str | None:
        """The program a turn asks to run (its last closed python block), or None: a turn with the final
        line, or without a program, is the answer."""
        if self.is_final(text):
            return None
        blocks = _PYTHON_BLOCK.findall(text)
        return blocks[-1] if blocks and blocks[-1].strip() else None

    def answer_text(self, episode) -> str:
        """What the task's checker reads of an episode: GSM8K, its final turn; functions, its last program
        (the final turn's, or else the last one it ran) in a fence, or "" when it wrote none or did not
        answer (the turn cap or the context ended it)."""
        if self.task == "gsm8k":
            return episode.final_text
        if episode.end_reason != "answered":
            return ""
        for turn in reversed(episode.turns):
            blocks = [b for b in _PYTHON_BLOCK.findall(turn) if b.strip()]
            if blocks:
                return f"```python\n{blocks[-1]}```"
        return ""

    def run_tool(self, program: str) -> tuple[str, bool]:
        """The tool's reply to ``program`` and whether the call failed. A program's own error is a reply
        like any other (the model reads its traceback's last lines); nothing here raises."""
        from sandbox.judge import classify

        limits = self.sandbox.limits
        answer, stdout, stderr, result = self.sandbox.run_one(program, "", "stdin", None, limits)
        verdict = classify(answer, stdout, result, {"output": ""}, {"testtype": "stdin"}, limits).verdict
        with self._lock:
            self._verdicts[verdict] += 1
        if verdict in ("accepted", "wrong_answer"):  # it ran to its end; what it printed is the reply
            printed = stdout.decode("utf-8", "replace").strip()
            return self._cut(printed or "(the program printed nothing: print the result)"), False
        if verdict == "runtime_error":
            lines = stderr.decode("utf-8", "replace").strip().splitlines()
            return self._cut("Error:\n" + "\n".join(lines[-3:])), True
        return STOPPED[verdict].format(time=limits.time_limit, memory=limits.memory_mb), True

    def _cut(self, text: str) -> str:
        return text if len(text) <= self.reply_chars else text[: self.reply_chars] + "\n[... output cut]"

    def score_episodes(self, examples: list[dict], episodes: list) -> list[dict]:
        """One score per episode (``common.episodes.Episode``): the checker's on the final answer of an
        answered episode, 0 for one the turn cap or the context stopped; shaping when asked for."""
        scores = []
        for example, episode in zip(examples, episodes, strict=True):
            calls = len(episode.tool_replies)
            if episode.end_reason == "answered" and self.task == "gsm8k":
                score = self.gsm8k.score([example], [episode.final_text])[0]
            elif episode.end_reason == "answered":
                score = self.single_turn.score([example], [self.answer_text(episode)])[0]
                score["format_reward"] = float(self.is_final(episode.final_text))
            elif self.task == "gsm8k":
                score = {"reward": 0.0, "correct": False, "format_reward": 0.0, "extracted": None}
            else:
                score = {"reward": 0.0, "correct": False, "format_reward": 0.0, "verdict": "no_code", "passed": 0}
                score["total"] = len(example["tests"])
            score["reward"] -= self.tool_error_penalty * episode.tool_failures + self.tool_call_cost * calls
            score.update(
                tool_calls=calls,
                tool_failures=episode.tool_failures,
                turns=len(episode.turns),
                end_reason=episode.end_reason,
            )
            scores.append(score)
        return scores

    def step_metrics(self) -> dict[str, float]:
        """The tool calls since the previous call, by how they ended; for functions, also the share of
        tests the answers' programs passed (the code judge's ``test_pass_fraction``)."""
        with self._lock:
            verdicts, self._verdicts = self._verdicts, Counter()
        calls = sum(verdicts.values())
        ran = verdicts["accepted"] + verdicts["wrong_answer"]
        metrics = {"tool_calls": float(calls), "tool_failure_rate": (calls - ran) / calls if calls else 0.0}
        if self.task == "functions" and self._code is not None:
            metrics["test_pass_fraction"] = self._code.step_metrics()["test_pass_fraction"]
        return metrics
