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

A script's hyperparameters are a dataclass: ``TrainingArgs`` (the options every training script
has) and the script's own fields, each an ``option(default, help)``. ``HyperparameterParser``
turns its fields into ``--name value`` arguments and returns an instance; the instance's
``validate(world_size)`` holds every check of the values.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import time
import traceback
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Literal

log = logging.getLogger("common")


class UserError(Exception):
    """Bad input the user can fix (option, file, row, channel). Reported without a traceback."""


# --------------------------------------------------------------------------- paths


def on_sagemaker() -> bool:
    """True when the training toolkit set up the environment (``SM_*`` variables beyond the
    channels and ``SM_HPS``, which a hand run may set too, or a relocated ``SAGEMAKER_BASE_DIR``)."""
    by_hand_too = ("SM_CHANNEL_", "SM_HPS")
    return "SAGEMAKER_BASE_DIR" in os.environ or any(
        key.startswith("SM_") and not key.startswith(by_hand_too) for key in os.environ
    )


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


def option(default, help: str, old_names: tuple[str, ...] = (), **argparse_options) -> dataclasses.Field:
    """A hyperparameter: a dataclass field with its default and its ``--help`` text. Other
    ``add_argument`` keywords (``choices=...``) go along. The help gets ``(default: ...)``
    appended unless it says ``default:`` itself. ``old_names`` are the names it had before a
    rename: they keep working for one release, with a deprecation message naming the new one."""
    return dataclasses.field(
        default=default, metadata={"help": help, "argparse": argparse_options, "old_names": tuple(old_names)}
    )


class _RenamedOption(argparse.Action):
    """``--old_name value``: stores the value under the new name and says, in one line, to use it."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(
            f"{option_string} is deprecated and goes in the next release: use --{self.dest} (same value).",
            file=sys.stderr,
            flush=True,
        )
        setattr(namespace, self.dest, values)


def _value_type(annotation) -> dict:
    """``add_argument`` keywords for a field's type: int, float, str, bool (SageMaker's "True"),
    ``X | None`` (as X, the default being None) and ``Literal[...]`` (choices)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)]
        if len(kinds) != 1:
            raise TypeError(f"an option is one type or that type | None, not {annotation}")
        annotation = kinds[0]
    if typing.get_origin(annotation) is typing.Literal:
        choices = list(typing.get_args(annotation))
        return {"type": type(choices[0]), "choices": choices}
    if annotation is bool:
        return {"type": str2bool}
    if annotation in (int, float, str):
        return {"type": annotation}
    raise TypeError(f"options are int, float, str, bool, X | None or Literal[...], not {annotation}")


class HyperparameterParser(argparse.ArgumentParser):
    """The parser of an options dataclass: one ``--name`` per field, ``parse()`` returns an instance.

    - a field's help is that of its ``option()``; a subclass that only changes a default
      (``max_steps: int = 200``) keeps the help of the class that declared the field;
    - the fields a class declares go under its ``help_group`` heading in ``--help``, if it has one;
    - abbreviations are refused (``--learning`` must not mean ``--learning_rate``);
    - an unknown or malformed hyperparameter raises ``UserError`` listing the valid ones;
    - ``parse()`` also reads ``SM_HPS`` (JSON) for keys not given on the command line;
    - a renamed option's old names (``option(..., old_names=...)``) still work, print a deprecation
      line, and are left out of ``--help``; giving the old and the new name together is an error.
    """

    def __init__(self, options_class: type, description: str, **kwargs):
        if not dataclasses.is_dataclass(options_class):
            raise TypeError(f"{options_class.__name__} is not a dataclass")
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(description=description, allow_abbrev=False, **kwargs)
        self.options_class = options_class
        annotations = typing.get_type_hints(options_class)
        # Base classes first: the first to have a field declared it; the last to give it help wins.
        fields_by_class = [
            (klass, vars(klass)["__dataclass_fields__"])
            for klass in reversed(options_class.__mro__)
            if "__dataclass_fields__" in vars(klass)
        ]
        groups = {None: self}
        self.old_names: dict[str, str] = {}  # old name -> the option's name now
        for field in dataclasses.fields(options_class):
            declared_by = next(klass for klass, fields in fields_by_class if field.name in fields)
            documented = [
                fields[field.name].metadata
                for _, fields in fields_by_class
                if "help" in getattr(fields.get(field.name), "metadata", {})
            ]
            if not documented:
                raise TypeError(
                    f"{options_class.__name__}.{field.name} has no help: declare it with option(default, help)"
                )
            help_text = documented[-1]["help"].replace("%", "%%")
            if "default:" not in help_text:
                help_text += " (default: %(default)s)"
            heading = vars(declared_by).get("help_group")
            if heading not in groups:
                groups[heading] = self.add_argument_group(heading)
            groups[heading].add_argument(
                f"--{field.name}",
                default=field.default,
                help=help_text,
                **{**_value_type(annotations[field.name]), **documented[-1]["argparse"]},
            )
            old_names = {
                old_name
                for _, fields in fields_by_class
                for old_name in getattr(fields.get(field.name), "metadata", {}).get("old_names", ())
            }
            for old_name in sorted(old_names):
                self.old_names[old_name] = field.name
                self.add_argument(
                    f"--{old_name}",
                    dest=field.name,
                    action=_RenamedOption,
                    default=argparse.SUPPRESS,
                    help=argparse.SUPPRESS,
                    **{**_value_type(annotations[field.name]), **documented[-1]["argparse"]},
                )

    def valid_names(self) -> list[str]:
        return sorted(
            opt[2:]
            for action in self._actions
            for opt in action.option_strings
            if opt.startswith("--") and opt != "--help" and opt[2:] not in self.old_names
        )

    def error(self, message: str):  # argparse calls this for every parse problem
        raise UserError(
            f"Bad hyperparameter: {message}. Valid hyperparameters: {', '.join(self.valid_names())}. "
            f"Run `python {self.prog} --help` for what each one means."
        )

    def parse(self, argv: list[str] | None = None):
        """The options from ``argv`` (default ``sys.argv[1:]``), then ``SM_HPS``, then the defaults."""
        argv = list(sys.argv[1:] if argv is None else argv)
        given = [a[2:].split("=", 1)[0] for a in argv if a.startswith("--")]
        for old_name, name in self.old_names.items():
            if old_name in given and name in given:
                raise UserError(f"--{old_name} is the old name of --{name}: give only --{name}.")
        given = {self.old_names.get(key, key) for key in given}
        hps = json.loads(os.environ.get("SM_HPS", "{}") or "{}")
        for key, value in sorted(hps.items()):
            # the toolkit's own keys; the command line wins (under either name of a renamed option)
            if key.startswith("sagemaker_") or self.old_names.get(key, key) in given:
                continue
            if isinstance(value, (dict, list)):
                value = json.dumps(value)
            argv += [f"--{key}", str(value)]
        args, unknown = self.parse_known_args(argv)
        if unknown:
            names = [
                a[2:].split("=", 1)[0] if a.startswith("--") else a for a in unknown if a.startswith("-")
            ] or unknown
            raise UserError(
                f"Unknown hyperparameter {', '.join(repr(n) for n in names)}. Valid hyperparameters: "
                f"{', '.join(self.valid_names())}. Run `python {self.prog} --help` for what each one means."
            )
        return self.options_class(**vars(args))


def require_at_least_one(options, *names: str) -> None:
    """``UserError`` for the first of the options ``names`` (counts, sizes) that is below 1."""
    for name in names:
        value = getattr(options, name)
        if value < 1:
            raise UserError(f"--{name} must be at least 1, got {value}.")


def require_whole_micro_batches(options, world_size: int) -> None:
    """``UserError`` unless ``--batch_size`` cuts into micro-batches of ``--per_device_batch_size``
    on each of ``world_size`` processes."""
    if options.batch_size % (options.per_device_batch_size * world_size):
        raise UserError(
            f"--batch_size {options.batch_size} must be a multiple of --per_device_batch_size "
            f"{options.per_device_batch_size} x {world_size} processes."
        )


@dataclasses.dataclass
class TrainingArgs:
    """The options every training script has. A script's options subclass this, add their own
    fields and give the first ones the script's defaults (``max_steps: int = 200``)."""

    model_name_or_path: str = option(
        "Qwen/Qwen2.5-0.5B-Instruct",
        "hub id or local folder of the starting model; the 'model' channel (SM_CHANNEL_MODEL) wins over it when given",
    )
    max_steps: int = option(100, "optimizer steps to run")
    seed: int = option(42, "seed for data order and initialisation")
    learning_rate: float = option(1e-5, "peak learning rate")
    checkpoint_every: int = option(50, "save a resumable checkpoint every N steps; 0 = not by steps")
    checkpoint_every_minutes: float = option(
        0.0,
        "also save once this many minutes have passed since the last "
        "save: bounds what a spot interruption costs in time; 0 = not by time",
    )
    checkpoint_in_background: bool = option(
        False, "copy the state to CPU memory and write it in a thread while training goes on"
    )
    keep_checkpoints: int = option(2, "how many recent checkpoints to keep")
    checkpoint_dir: str | None = option(
        None,
        "where checkpoints go and are resumed from (default: /opt/ml/checkpoints "
        "under SageMaker, synced with checkpoint_s3_uri; ./checkpoints by hand)",
    )
    strategy: Literal["ddp", "fsdp"] = option(
        "ddp",
        "ddp: a full model copy per GPU; fsdp: shard parameters, "
        "gradients and optimizer state (FSDP2, bf16 compute, activation "
        "checkpointing) for models that do not fit one GPU",
    )
    log_every: int = option(1, "print a metric line every N steps")

    def validate(self, world_size: int) -> None:
        """Refuse values that cannot work, saying which option to change (``world_size``: the
        processes that train together). A script's class adds its own checks."""
        require_at_least_one(self, "max_steps", "log_every")
        if self.checkpoint_every < 0 or self.checkpoint_every_minutes < 0:
            raise UserError(
                f"--checkpoint_every ({self.checkpoint_every}) and --checkpoint_every_minutes "
                f"({self.checkpoint_every_minutes}) cannot be negative; 0 turns either off."
            )


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


def hold_nice_value() -> bool:
    """Give this process's session the nice value the process has, where it leads that session; True
    if it did. Most Linux kernels schedule by autogroup: each session (``setsid``) is a group, and the
    CPU is shared between groups whatever the nice values inside them. ``torchrun`` starts every
    worker in a session of its own, so ``nice torchrun train.py`` would not lower the workers' share
    (local mode starts a notebook's jobs so when their lane yields the cores to another). Nothing to
    do at nice 0, without autogroups, or in a session this process did not start (a terminal's)."""
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness <= 0 or os.getsid(0) != os.getpid():
        return False
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write(str(niceness))
    except OSError:  # no autogroups (another kernel, another system), or not allowed
        return False
    return True


def run_main(main: Callable[[], object]) -> None:
    """Run ``main()``. On error: log it, write a one-paragraph reason to the failure file, exit 1.

    ``UserError`` (bad option, file, row, channel, model path) is reported without a traceback;
    anything else is unexpected, so its traceback goes to the log and its last line to the file.
    Called by a script's ``__main__`` (the process is the script's), it ends the process through
    ``exit_past_gloo_threads``.
    """
    setup_logging()
    hold_nice_value()
    whole_process = getattr(main, "__module__", None) == "__main__"  # not a test calling it in its own process
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
        exit_past_gloo_threads(1, whole_process)
    except BaseException as error:  # noqa: BLE001 - the last line of defence
        log.error("Unexpected error:\n%s", traceback.format_exc())
        name = type(error).__name__
        path = write_failure(f"{prefix}Unexpected {name}: {error} (full traceback in the job's log)", run_started)
        log.error("Reason written to %s", path)
        exit_past_gloo_threads(1, whole_process)
    exit_past_gloo_threads(0, whole_process)


GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")  # the names gloo's C++ threads give themselves


def gloo_threads() -> list[str]:
    """The gloo threads (C++, invisible to ``threading``) still running in this process (Linux)."""
    names = []
    for task in Path("/proc/self/task").glob("*"):
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # the thread ended while we looked
            continue
    return [name for name in names if name in GLOO_THREADS]


def exit_past_gloo_threads(status: int, whole_process: bool = True) -> None:
    """End with ``status`` (0: return to the interpreter's exit; else ``sys.exit``) or, while gloo's
    threads still run in a process that is the script's (``whole_process``), ``os._exit(status)``
    once Python's own work is done (other threads joined, logs and standard streams flushed).

    ``destroy_process_group`` does not end a gloo process group's threads once a DTensor was made on
    it (FSDP2's parameters, a sharded checkpoint): PyTorch holds the group from C++ until the process
    ends, out of reach of ``gc`` and of the backend's ``shutdown``. The threads then run on while the
    interpreter and the C++ runtime tear themselves down, and now and then a rank aborts after its
    work is done ("terminate called without an active exception", exit -6), which fails a SageMaker
    job. By then the script's work is on disk, so the interpreter's own teardown (and its ``atexit``
    handlers) is skipped.
    """
    if not whole_process or not gloo_threads():
        if status:
            sys.exit(status)
        return
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()  # what the interpreter would wait for (a checkpoint still being written)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
