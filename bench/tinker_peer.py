"""The local training-session service against a Tinker-compatible server: SkyRL's Tinker API server.

    python -m bench.tinker_peer [--steps 5] [--in-flight 1 16]

Both servers get the same work, on CPU, one thread each:
  * the model: the tiny model's tokenizer and sizes in Qwen3's layout (SkyRL's JAX backend implements
    Qwen3, Llama 3 and DeepSeek-V3, not the tiny model's Qwen2), random weights, ``outputs/bench/models``;
  * LoRA rank 8, 8 datums of cross-entropy: forward_backward + optim_step, both awaited, per step;
  * sampling: ``--in-flight`` requests of 1 sample x 512 tokens (the SageMaker API's smallest max_tokens)
    sent at once, after one warm-up request; tokens/s = tokens generated / wall time.
Ours runs ``local_mode/session_service`` driven by SageMaker's SDK v3 (``.venv-sessions``); the peer
runs ``python -m skyrl.tinker.api --backend jax`` driven by the ``tinker`` SDK, both from
``.venv-bench-peer`` (requirements-bench-peer.txt, built by ``make bench``). The same client program,
``bench/tinker_peer_client.py``, makes both sides' calls.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.fixtures import BENCH_OUTPUT
from bench.tables import Row, format_table, machine_description
from local_mode import environment_python
from local_mode.os_utils import stop_process_group

PEER_PYTHON = Path(environment_python(".venv-bench-peer"))
SESSIONS_PYTHON = Path(environment_python(".venv-sessions"))  # the SDK v3 environment
CLIENT = Path(__file__).with_name("tinker_peer_client.py")
RANK, MAX_TOKENS = 8, 512
# Two things stand between skyrl 0.3.0's server as released and this machine, and the benchmark works
# around both without touching SkyRL's code:
#  * it allows Python 3.11 (this project's) but declares a pydantic field with typing.TypedDict, which
#    pydantic refuses before 3.12 ("Please use typing_extensions.TypedDict"): each of its processes
#    runs with typing_extensions' TypedDict in typing's place;
#  * the API server starts its engine as `uv run <the flags of the uv run that started the server>
#    -m skyrl.tinker.engine ...`, read from its parent's command line, so it must be started by
#    `uv run` inside SkyRL's own source tree. A stand-in `uv` on PATH runs both processes with the
#    benchmark environment's Python instead, staying their parent as `uv run` would.
UV_STAND_IN = """#!{python}
import subprocess, sys
args = sys.argv[1:]  # run [uv flags] -m MODULE [module arguments]
at = args.index("-m")
module, rest = args[at + 1], args[at + 2 :]
code = (
    "import runpy, typing, typing_extensions; typing.TypedDict = typing_extensions.TypedDict; "
    f"runpy.run_module({{module!r}}, run_name='__main__', alter_sys=True)"
)
sys.exit(subprocess.call([sys.executable, "-c", code, *rest]))
"""
# JAX on CPU with one compute thread, as our service runs torch with one.
ONE_THREAD_JAX = {
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}


def peer_missing() -> str | None:
    """Why the peer cannot run here, or None."""
    if not PEER_PYTHON.exists():
        return "the benchmark-only environment .venv-bench-peer is missing (make bench builds it)"
    if not SESSIONS_PYTHON.exists():
        return "the SDK v3 environment .venv-sessions is missing"
    return None


def qwen3_model_dir() -> Path:
    """The tiny model's tokenizer with its sizes in Qwen3's layout, random weights (seed 0), built once."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from local_mode.tiny_model import TINY_CONFIG, tiny_model_dir

    target = BENCH_OUTPUT / "models" / "tiny-qwen3"
    if (target / "config.json").exists():
        return target
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        head_dim=TINY_CONFIG["hidden_size"] // TINY_CONFIG["num_attention_heads"],
        **TINY_CONFIG,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    staging = Path(tempfile.mkdtemp(prefix="tiny-qwen3.", dir=target.parent if target.parent.exists() else None))
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    return target


def work(model: Path, steps: int, in_flight: list[int]) -> dict:
    from transformers import AutoTokenizer

    from bench.training_sessions import batch

    tokenizer = AutoTokenizer.from_pretrained(model)
    return {
        "rank": RANK,
        "steps": steps,
        "warmup": 2,
        "datums": batch(tokenizer),
        "prompt": tokenizer("Once upon a time", add_special_tokens=False)["input_ids"],
        "max_tokens": MAX_TOKENS,
        "in_flight": in_flight,
    }


def run_client(python: Path, api: str, config: dict, env: dict) -> dict:
    done = subprocess.run(
        [str(python), str(CLIENT), api, json.dumps(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {api} client failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ours(model: Path, config: dict) -> dict:
    from local_mode import session_service

    os.environ.setdefault("SAGEMAKER_LOCAL_SESSION_THREADS", "1")
    root = Path(tempfile.mkdtemp(prefix="peer-bench-ours-"))
    endpoint = session_service.start_service(root)
    try:
        session_service.register_base_model("bench/tiny-qwen3", str(model), root)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON"))}
        env.update(endpoint.client_environment())
        return run_client(SESSIONS_PYTHON, "sagemaker", {**config, "model": "bench/tiny-qwen3"}, env)
    finally:
        session_service.stop_service(root)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_peer(model: Path, config: dict, timeout: float = 600) -> dict:
    """SkyRL's Tinker API server in its own process (JAX backend, CPU), the tinker SDK against it."""
    root = Path(tempfile.mkdtemp(prefix="peer-bench-skyrl-"))
    port = free_port()
    backend = {
        "max_lora_rank": RANK,
        "max_lora_adapters": 2,
        "train_micro_batch_size": 8,
        "sample_max_num_sequences": 16,
    }
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text(UV_STAND_IN.format(python=PEER_PYTHON))
    (bin_dir / "uv").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(ONE_THREAD_JAX, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    log = open(root / "server.log", "w")  # noqa: SIM115 - closed after the server stops
    server = subprocess.Popen(
        [str(bin_dir / "uv"), "run", "-m", "skyrl.tinker.api", "--base-model", str(model), "--backend", "jax"]
        + ["--backend-config", json.dumps(backend), "--port", str(port), "--host", "127.0.0.1"]
        + ["--database-url", f"sqlite:///{root / 'tinker.db'}", "--checkpoints-base", str(root / "checkpoints")],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None:
                raise RuntimeError(
                    f"the SkyRL server exited ({server.returncode}):\n{(root / 'server.log').read_text()[-4000:]}"
                )
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=5).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the SkyRL server did not answer within {timeout:.0f} s") from None
                time.sleep(1)
        client_env = {**env, "TINKER_API_KEY": "tml-local"}
        config = {**config, "model": str(model), "base_url": f"http://127.0.0.1:{port}", "api_key": "tml-local"}
        return run_client(PEER_PYTHON, "tinker", config, client_env)
    finally:  # the stand-in uv, the API server and its engine: one process group
        stop_process_group(server.pid, grace_s=20)
        server.wait()
        log.close()


def measure(steps: int = 5, in_flight: list[int] | None = None) -> list[Row]:
    missing = peer_missing()
    if missing:
        return [Row("tinker peer", "not run", None, "-", notes=missing)]
    in_flight = in_flight or [1, 16]
    model = qwen3_model_dir()
    config = work(model, steps, in_flight)
    ours = run_ours(model, config)
    peer = run_peer(model, config)
    case = f"tiny Qwen3 layout, {len(config['datums'])} datums, LoRA r{RANK}"
    rows = [
        Row(
            "sessions vs SkyRL Tinker: forward_backward + optim_step",
            case,
            statistics.median(ours["steps"]),
            "s/step",
            baseline=statistics.median(peer["steps"]),
            baseline_name="SkyRL 0.3.0 (JAX, CPU)",
            notes=f"median of {steps} after 2 warm-up; goal ratio <= 1",
        )
    ]
    for count in in_flight:
        mine, theirs = ours["sampling"][str(count)], peer["sampling"][str(count)]
        rows.append(
            Row(
                "sessions vs SkyRL Tinker: sampling",
                f"{count} request(s) in flight, 1 x <= {MAX_TOKENS} tokens each",
                mine["tokens"] / mine["seconds"],
                "tokens/s",
                baseline=theirs["tokens"] / theirs["seconds"],
                baseline_name="SkyRL 0.3.0 (JAX, CPU)",
                notes=f"{mine['tokens']} vs {theirs['tokens']} tokens; goal ratio >= 1",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    machine = machine_description(os.getloadavg(), threads=1)  # each server's
    rows = measure(args.steps, args.in_flight)
    print(format_table(rows, "Training sessions against a Tinker-compatible server", machine))


if __name__ == "__main__":
    main()
