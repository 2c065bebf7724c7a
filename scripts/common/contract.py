"""The SageMaker training contract, and sensible defaults when a script runs by hand.

SageMaker (through the ``sagemaker-training`` toolkit) starts a script as
``python sft.py --key value ...`` (or under ``torchrun``) with:

- hyperparameters as ``--key value`` arguments, and the same as JSON in ``SM_HPS``;
- one folder per input channel in ``SM_CHANNEL_<NAME>`` (``fit({"train": "s3://..."})``
  gives ``SM_CHANNEL_TRAIN``);
- ``SM_MODEL_DIR`` (uploaded as ``model.tar.gz``), ``SM_OUTPUT_DATA_DIR`` (``output.tar.gz``),
  ``SM_OUTPUT_DIR`` (the ``failure`` file goes there), ``SM_HOSTS``, ``SM_CURRENT_HOST``,
  ``SM_NUM_GPUS``, ``SM_CURRENT_INSTANCE_TYPE``;
- ``/opt/ml/checkpoints`` synced with S3 when the estimator has ``checkpoint_s3_uri``
  (SageMaker sets no variable for it). ``SAGEMAKER_BASE_DIR`` relocates ``/opt/ml``.

Outside SageMaker (no ``SM_*`` variable but channels and ``SM_HPS``) every path has a default
under the current directory (``./output/model``, ``./output/data``, ``./output/failure``,
``./checkpoints``); channels are folders given as ``SM_CHANNEL_TRAIN=/path/to/folder python sft.py``.

API:
    UserError                   an expected, explainable error: message only, no traceback
    HyperparameterParser        argparse parser: no abbreviations, unknown option -> UserError
                                listing the valid ones; ``parse(argv=None)`` merges ``SM_HPS``
    str2bool                    argparse type accepting SageMaker's "True"/"False"
    add_common_arguments(p)     --model_name_or_path --max_steps --seed --learning_rate
                                --checkpoint_every --checkpoint_every_minutes --checkpoint_in_background
                                --keep_checkpoints --checkpoint_dir
                                --strategy --log_every
    channel_file(name, file)    path of ``<file>`` in channel ``name`` (clear error when missing)
    has_channel(name)           whether channel ``name`` was given
    model_dir(), output_data_dir(), output_dir(), failure_file(), default_checkpoint_dir()
    hosts(), current_host(), num_gpus(), instance_type(), on_sagemaker()
    instance_groups(), current_instance_group()   the cluster's instance groups, this host's group
    run_main(main)              call ``main()``; on error write the failure file, exit non-zero
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("common")


class UserError(Exception):
    """Bad input the user can fix (option, file, row, channel). Reported without a traceback."""


# --------------------------------------------------------------------------- paths


def on_sagemaker() -> bool:
    """True when the training toolkit set up the environment (``SM_*`` variables beyond the
    channels and ``SM_HPS``, which a hand run may set too, or a relocated ``SAGEMAKER_BASE_DIR``)."""
    by_hand_too = ("SM_CHANNEL_", "SM_HPS")
    return "SAGEMAKER_BASE_DIR" in os.environ or any(
        key.startswith("SM_") and not key.startswith(by_hand_too) for key in os.environ)


def _base_dir() -> Path:
    return Path(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"))


def model_dir() -> Path:
    """Where the final model goes (``SM_MODEL_DIR``; by hand ``./output/model``)."""
    if "SM_MODEL_DIR" in os.environ:
        return Path(os.environ["SM_MODEL_DIR"])
    return _base_dir() / "model" if on_sagemaker() else Path("output/model")


def output_data_dir() -> Path:
    """Where metrics.jsonl and other outputs go (``SM_OUTPUT_DATA_DIR``; by hand ``./output/data``)."""
    if "SM_OUTPUT_DATA_DIR" in os.environ:
        return Path(os.environ["SM_OUTPUT_DATA_DIR"])
    return _base_dir() / "output" / "data" if on_sagemaker() else Path("output/data")


def output_dir() -> Path:
    """The folder of the failure file (``SM_OUTPUT_DIR``; by hand ``./output``)."""
    if "SM_OUTPUT_DIR" in os.environ:
        return Path(os.environ["SM_OUTPUT_DIR"])
    return _base_dir() / "output" if on_sagemaker() else Path("output")


def failure_file() -> Path:
    """SageMaker shows this file's text as the job's FailureReason."""
    return output_dir() / "failure"


def default_checkpoint_dir() -> Path:
    """``/opt/ml/checkpoints`` under SageMaker (synced with ``checkpoint_s3_uri``), else ``./checkpoints``."""
    if "SAGEMAKER_BASE_DIR" in os.environ:
        return Path(os.environ["SAGEMAKER_BASE_DIR"]) / "checkpoints"
    return Path("/opt/ml/checkpoints") if on_sagemaker() else Path("checkpoints")


def hosts() -> list[str]:
    """All hosts of the job (``SM_HOSTS``), ``["localhost"]`` by hand."""
    return json.loads(os.environ.get("SM_HOSTS", '["localhost"]'))


def current_host() -> str:
    return os.environ.get("SM_CURRENT_HOST", "localhost")


def num_gpus() -> int:
    """GPUs on this host (``SM_NUM_GPUS``; by hand what torch sees)."""
    if "SM_NUM_GPUS" in os.environ:
        return int(os.environ["SM_NUM_GPUS"])
    import torch

    return torch.cuda.device_count()


def instance_type() -> str:
    """For example ``ml.p4de.24xlarge``; ``local`` by hand."""
    return os.environ.get("SM_CURRENT_INSTANCE_TYPE", "local")


def instance_groups() -> dict[str, list[str]]:
    """The cluster's instance groups as ``{name: [host, ...]}`` (``SM_INSTANCE_GROUPS_DICT``, which the
    toolkit fills from ``ResourceConfig.InstanceGroups``; a plain cluster is one group named
    ``homogeneousCluster``); ``{}`` by hand."""
    groups = json.loads(os.environ.get("SM_INSTANCE_GROUPS_DICT", "{}") or "{}")
    return {name: list(group["hosts"]) for name, group in groups.items()}


def current_instance_group() -> str:
    """This host's instance group (``SM_CURRENT_INSTANCE_GROUP``); ``""`` by hand."""
    return os.environ.get("SM_CURRENT_INSTANCE_GROUP", "")


# --------------------------------------------------------------------------- channels


def has_channel(name: str) -> bool:
    return f"SM_CHANNEL_{name.upper()}" in os.environ


def channel_dir(name: str) -> Path:
    """The folder of input channel ``name``; a clear error when the job was started without it."""
    variable = f"SM_CHANNEL_{name.upper()}"
    if variable not in os.environ:
        raise UserError(
            f"Input channel '{name}' is missing ({variable} is not set). Pass it when starting the job, "
            f"e.g. estimator.fit({{'{name}': 's3://bucket/prefix/'}}) (InputDataConfig ChannelName '{name}'), "
            f"or when running by hand: {variable}=/path/to/folder python <script> ..."
        )
    folder = Path(os.environ[variable])
    if not folder.is_dir():
        raise UserError(f"Input channel '{name}': {variable}={folder} is not a folder.")
    return folder


def channel_file(name: str, filename: str) -> Path:
    """``<channel>/<filename>``; if that file is absent but the channel holds exactly one file with
    the same extension, that one (an S3 prefix with a single ``data.jsonl`` works too)."""
    folder = channel_dir(name)
    path = folder / filename
    if path.is_file():
        return path
    same_kind = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == Path(filename).suffix)
    if len(same_kind) == 1:
        return same_kind[0]
    found = ", ".join(p.name for p in sorted(folder.iterdir())) or "nothing"
    raise UserError(
        f"Input channel '{name}' ({folder}) has no {filename} (found: {found}). "
        f"Upload the data as {filename} under the channel's S3 prefix."
    )


# --------------------------------------------------------------------------- hyperparameters


def str2bool(value: str | bool) -> bool:
    """Booleans as SageMaker sends them (``True``/``False``), and the usual spellings."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "y", "on"):
        return True
    if text in ("false", "0", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


class HyperparameterParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` for SageMaker hyperparameters.

    - abbreviations are refused (``--learning`` must not mean ``--learning_rate``);
    - an unknown or malformed hyperparameter raises ``UserError`` listing the valid ones;
    - ``parse()`` also reads ``SM_HPS`` (JSON) for keys not given on the command line.
    """

    def __init__(self, description: str, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(description=description, allow_abbrev=False, **kwargs)

    def valid_names(self) -> list[str]:
        return sorted(
            opt[2:] for action in self._actions for opt in action.option_strings if opt.startswith("--") and opt != "--help"
        )

    def error(self, message: str):  # argparse calls this for every parse problem
        raise UserError(
            f"Bad hyperparameter: {message}. Valid hyperparameters: {', '.join(self.valid_names())}. "
            f"Run `python {self.prog} --help` for what each one means."
        )

    def parse(self, argv: list[str] | None = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if argv is None else argv)
        given = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}
        hps = json.loads(os.environ.get("SM_HPS", "{}") or "{}")
        for key, value in sorted(hps.items()):
            if key.startswith("sagemaker_") or key in given:  # the toolkit's own keys; the command line wins
                continue
            if isinstance(value, (dict, list)):
                value = json.dumps(value)
            argv += [f"--{key}", str(value)]
        args, unknown = self.parse_known_args(argv)
        if unknown:
            names = [a[2:].split("=", 1)[0] if a.startswith("--") else a for a in unknown if a.startswith("-")] or unknown
            raise UserError(
                f"Unknown hyperparameter {', '.join(repr(n) for n in names)}. Valid hyperparameters: "
                f"{', '.join(self.valid_names())}. Run `python {self.prog} --help` for what each one means."
            )
        return args


def add_common_arguments(parser: argparse.ArgumentParser, *, model: str, learning_rate: float, max_steps: int) -> None:
    """The options every training script has (defaults given by the script)."""
    parser.add_argument("--model_name_or_path", default=model,
                        help="hub id or local folder of the starting model; the 'model' channel "
                             "(SM_CHANNEL_MODEL) wins over it when given (default: %(default)s)")
    parser.add_argument("--max_steps", type=int, default=max_steps, help="optimizer steps to run (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=42, help="seed for data order and initialisation (default: %(default)s)")
    parser.add_argument("--learning_rate", type=float, default=learning_rate, help="peak learning rate (default: %(default)s)")
    parser.add_argument("--checkpoint_every", type=int, default=50,
                        help="save a resumable checkpoint every N steps; 0 = not by steps (default: %(default)s)")
    parser.add_argument("--checkpoint_every_minutes", type=float, default=0.0,
                        help="also save once this many minutes have passed since the last save: bounds what a spot "
                             "interruption costs in time; 0 = not by time (default: %(default)s)")
    parser.add_argument("--checkpoint_in_background", type=str2bool, default=False,
                        help="copy the state to CPU memory and write it in a thread while training goes on "
                             "(default: %(default)s)")
    parser.add_argument("--keep_checkpoints", type=int, default=2, help="how many recent checkpoints to keep (default: %(default)s)")
    parser.add_argument("--checkpoint_dir", default=None,
                        help="where checkpoints go and are resumed from (default: /opt/ml/checkpoints under "
                             "SageMaker, synced with checkpoint_s3_uri; ./checkpoints by hand)")
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp",
                        help="ddp: a full model copy per GPU; fsdp: shard parameters, gradients and optimizer "
                             "state (FSDP2, bf16 compute, activation checkpointing) for models that do not fit one GPU "
                             "(default: %(default)s)")
    parser.add_argument("--log_every", type=int, default=1, help="print a metric line every N steps (default: %(default)s)")


# --------------------------------------------------------------------------- failure


def setup_logging() -> None:
    """One format for every script; INFO on the console (SageMaker sends it to CloudWatch)."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def write_failure(reason: str, run_started: float | None = None) -> Path:
    """Write the failure reason atomically. The first reason of this run wins: when one rank
    fails, the others fail next on a broken collective, and that is not the reason to show.
    A file older than ``run_started`` (a previous run's) is replaced."""
    path = failure_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    if run_started is not None and path.exists() and path.stat().st_mtime >= run_started:
        log.error("A reason is already in %s (another process failed first); not replacing it.", path)
        return path
    temporary = path.with_name(f".failure.{os.getpid()}")
    temporary.write_text(reason.strip() + "\n")
    os.replace(temporary, path)
    return path


def run_main(main: Callable[[], object]) -> None:
    """Run ``main()``. On error: log it, write a one-paragraph reason to the failure file, exit 1.

    ``UserError`` (bad option, file, row, channel, model path) is reported without a traceback;
    anything else is unexpected, so its traceback goes to the log and its last line to the file.
    """
    setup_logging()
    run_started = time.time()  # a failure file older than this is a previous run's
    rank = os.environ.get("RANK")
    prefix = f"rank {rank}: " if rank not in (None, "0") else ""
    try:
        main()
    except SystemExit as stop:  # argparse --help, or an explicit sys.exit
        if stop.code not in (0, None):
            write_failure(f"{prefix}exited with status {stop.code}", run_started)
        raise
    except UserError as error:
        log.error("%s", error)
        path = write_failure(f"{prefix}{error}", run_started)
        log.error("Reason written to %s", path)
        sys.exit(1)
    except BaseException as error:  # noqa: BLE001 - the last line of defence
        log.error("Unexpected error:\n%s", traceback.format_exc())
        name = type(error).__name__
        path = write_failure(f"{prefix}Unexpected {name}: {error} (full traceback in the job's log)", run_started)
        log.error("Reason written to %s", path)
        sys.exit(1)
