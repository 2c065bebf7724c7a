"""One /opt/ml tree per host and the command that runs the real training toolkit on it.

Two layouts, chosen once per process and said in the live log:

* ``mount namespaces`` (root, ``unshare`` present: CI, containers, most Linux boxes as root).
  Every host process gets its own mount and UTS namespace, its tree bind-mounted at the literal
  ``/opt/ml``, a private ``/etc/hosts`` where ``algo-1..algo-N`` resolve to 127.0.0.1, and the
  hostname ``algo-i``. The machine's own ``/etc/hosts`` is never written; an empty ``/opt/ml``
  mount point is created when missing.
* ``loopback addresses`` (everything else: laptops, Studio). ``SAGEMAKER_BASE_DIR`` relocates
  ``/opt/ml`` (the toolkit reads it) and the hosts are named by distinct loopback addresses
  ``127.0.0.1..127.0.0.N`` in the resource config, so torchrun's ``--master_addr`` resolves
  without touching name resolution. ``SM_CURRENT_HOST`` then reads ``127.0.0.i`` instead of
  ``algo-i``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

PYTORCH_TRAINING_MODULE = "sagemaker_pytorch_container.training:main"
NAMESPACES = "mount namespaces"
LOOPBACK = "loopback addresses"

# Runs inside the new namespaces: private /etc/hosts, the host tree at /opt/ml, hostname algo-i,
# then the container's entry point: the image's (`train` is sagemaker_training.cli.train) or the
# request's ContainerEntrypoint + ContainerArguments.
_IN_NAMESPACE = 'mount --bind "$1" /etc/hosts && mount --bind "$2" /opt/ml && hostname "$3" && shift 3 && exec "$@"'


@cache
def isolation() -> str:
    if os.environ.get("SAGEMAKER_LOCAL_NO_NAMESPACES") == "1" or os.geteuid() != 0 or not shutil.which("unshare"):
        return LOOPBACK
    try:
        os.makedirs("/opt/ml", exist_ok=True)
        probe = subprocess.run(
            ["unshare", "--mount", "--uts", "--propagation", "private", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return LOOPBACK
    return NAMESPACES if probe.returncode == 0 else LOOPBACK


HOMOGENEOUS_GROUP = "homogeneousCluster"  # the group name SageMaker gives a job without InstanceGroups


@dataclass
class Host:
    name: str  # algo-i: log stream names and messages
    address: str  # what the toolkit sees as the host name (algo-i, or 127.0.0.i in LOOPBACK)
    tree: Path  # this host's /opt/ml
    group: str = HOMOGENEOUS_GROUP  # its instance group
    instance_type: str = ""
    checkpoints: Path | None = None  # the real folder behind CheckpointConfig.LocalPath
    tmp: Path | None = None  # its temporary folder (TMPDIR), removed when the job ends, as a container's /tmp
    synced: dict = field(default_factory=dict)  # checkpoint file -> (size, mtime) last uploaded

    @property
    def base_dir(self) -> str:
        """Where the host's processes see the tree."""
        return "/opt/ml" if isolation() == NAMESPACES else str(self.tree)

    def path(self, opt_ml_path: str) -> Path:
        """The real location of a path the container sees under /opt/ml."""
        return self.tree / os.path.relpath(opt_ml_path, "/opt/ml")


def instance_groups(resources: dict) -> list[dict]:
    """``ResourceConfig.InstanceGroups``, or the one group SageMaker makes of InstanceType/InstanceCount."""
    if "InstanceGroups" in resources:
        return resources["InstanceGroups"]
    return [
        {
            "InstanceGroupName": HOMOGENEOUS_GROUP,
            "InstanceType": resources["InstanceType"],
            "InstanceCount": resources["InstanceCount"],
        }
    ]


def make_hosts(run_dir: Path, groups: list[dict]) -> list[Host]:
    """algo-1..algo-N over the groups in their order: the first group's hosts come first."""
    mode = isolation()
    members = [(g["InstanceGroupName"], g["InstanceType"]) for g in groups for _ in range(g["InstanceCount"])]
    hosts = []
    for i, (group, instance_type) in enumerate(members, start=1):
        address = f"algo-{i}" if mode == NAMESPACES else f"127.0.0.{i}"
        hosts.append(Host(f"algo-{i}", address, run_dir / f"algo-{i}" / "opt" / "ml", group, instance_type))
    if mode == NAMESPACES:
        system_hosts = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
        names = " ".join(h.name for h in hosts)
        (run_dir / "etc_hosts").write_text(f"127.0.0.1 localhost {names}\n{system_hosts}")
    return hosts


def receives(host: Host, channel: dict) -> bool:
    """Whether a channel reaches the host: ``InstanceGroupNames`` limits it to those groups."""
    groups = channel["DataSource"]["S3DataSource"].get("InstanceGroupNames")
    return not groups or host.group in groups


def write_config(host: Host, hosts: list[Host], request: dict, hyperparameters: dict) -> None:
    """input/config/*.json exactly as SageMaker writes them (network interface: loopback).

    The toolkit derives SM_CURRENT_INSTANCE_GROUP, SM_CURRENT_INSTANCE_GROUP_HOSTS,
    SM_INSTANCE_GROUPS and SM_INSTANCE_GROUPS_DICT from resourceconfig.json's
    ``current_group_name`` and ``instance_groups``.
    """
    config = host.tree / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    groups = [
        {
            "instance_group_name": group["InstanceGroupName"],
            "instance_type": group["InstanceType"],
            "hosts": [h.address for h in hosts if h.group == group["InstanceGroupName"]],
        }
        for group in instance_groups(request["ResourceConfig"])
    ]
    resource = {
        "current_host": host.address,
        "current_instance_type": host.instance_type,
        "current_group_name": host.group,
        "hosts": [h.address for h in hosts],
        "instance_groups": groups,
        "network_interface_name": "lo",
    }
    channels = {
        c["ChannelName"]: {
            "TrainingInputMode": c.get("InputMode", request["AlgorithmSpecification"].get("TrainingInputMode", "File")),
            "S3DistributionType": c["DataSource"]["S3DataSource"].get("S3DataDistributionType", "FullyReplicated"),
            "RecordWrapperType": c.get("RecordWrapperType", "None"),
            **({"ContentType": c["ContentType"]} if "ContentType" in c else {}),
        }
        for c in request.get("InputDataConfig", [])
        if receives(host, c)
    }
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    (config / "inputdataconfig.json").write_text(json.dumps(channels))
    for sub in ("model", "output/data", "code", "input/data"):
        (host.tree / sub).mkdir(parents=True, exist_ok=True)


def container_entrypoint(job: dict) -> list[str] | None:
    """The request's ContainerEntrypoint + ContainerArguments: they replace the image's entry point
    (the toolkit), as in SageMaker."""
    algorithm = job["AlgorithmSpecification"]
    if not algorithm.get("ContainerEntrypoint"):
        return None
    return [*algorithm["ContainerEntrypoint"], *algorithm.get("ContainerArguments", [])]


def host_command(host: Host, run_dir: Path, entrypoint: list[str] | None = None) -> list[str]:
    """The toolkit, or ``entrypoint`` (a request's ContainerEntrypoint + ContainerArguments)."""
    command = entrypoint or [sys.executable, "-m", "sagemaker_training.cli.train"]
    if isolation() == NAMESPACES:
        return [
            "unshare", "--mount", "--uts", "--propagation", "private", "--",
            "/bin/sh", "-c", _IN_NAMESPACE, "sh", str(run_dir / "etc_hosts"), str(host.tree), host.name, *command,
        ]  # fmt: skip
    return command


def host_environment(host: Host, job: dict, region: str, training_module: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "AWS_", "SAGEMAKER_"))}
    env.update(job.get("Environment", {}))
    env.update(
        {
            # torchrun and the venv's python first on PATH, as in the training image.
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONUNBUFFERED": "1",
            "TRAINING_JOB_NAME": job["TrainingJobName"],
            "TRAINING_JOB_ARN": job["TrainingJobArn"],
            "AWS_REGION": region,
            # The toolkit otherwise waits up to 15 minutes for the hosts' DNS names.
            "SM_STUDIO_LOCAL_MODE": "true",
            # Gloo (CPU) and NCCL talk over loopback: all hosts are on this machine.
            "GLOO_SOCKET_IFNAME": "lo",
        }
    )
    if "OMP_NUM_THREADS" not in job.get("Environment", {}):
        env["OMP_NUM_THREADS"] = str(threads_per_host(job))
    if training_module:
        env["SAGEMAKER_TRAINING_MODULE"] = training_module
    if isolation() != NAMESPACES:
        env["SAGEMAKER_BASE_DIR"] = str(host.tree)
    if host.tmp is not None:
        env["TMPDIR"] = str(host.tmp)
    return env


def threads_per_host(job: dict) -> int:
    """Each instance has its own cores on SageMaker; here all hosts share this machine's. A host that
    takes every core makes N hosts run N times as many busy threads as there are cores, and a step
    then waits for threads that are spinning elsewhere (notebook 1's two-host SFT job ran 4.6x slower
    so). The cores are this process's, or its ``OMP_NUM_THREADS`` where set (the main job gives each
    of its lanes a share so); the job's own ``OMP_NUM_THREADS`` wins."""
    hosts = sum(group["InstanceCount"] for group in instance_groups(job["ResourceConfig"]))
    return max(1, machine_threads() // hosts)


def machine_threads() -> int:
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return int(os.environ["OMP_NUM_THREADS"])
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def native_bf16() -> bool:
    """Whether this machine's CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX, read from Linux's
    /proc/cpuinfo; elsewhere False): only there is bf16 faster than fp32."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def link_or_copy_tree(src: Path, dst: Path) -> None:
    """Hard-link a downloaded channel into a host's tree (copy when links are not possible)."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)


# What stays of an instance's /opt/ml tree once its job has ended, for inspection: what the job was
# given (input/config, code) and what it reported (output: failure, data).
KEPT_AFTER_JOB = ("input/config", "code", "output")


def release_instances(hosts: list[Host], downloads: Path | None = None) -> int:
    """Free what SageMaker loses with a job's instances and keeps in S3 only: all of each host's tree
    but ``KEPT_AFTER_JOB`` (its model, the leader's is model.tar.gz by now; its checkpoints, synced, with
    any half-written one a script staged beside them; its input channels), and the job's ``downloads``
    once no attempt needs them. Returns the bytes freed: a model of 135 M parameters is 540 MB a copy."""
    folders: list[Path] = []
    for host in hosts:
        folders += _released_parts(host.tree, [host.tree / k for k in KEPT_AFTER_JOB])
        folders += [host.checkpoints] if host.checkpoints is not None else []
    if downloads is not None:
        folders.append(downloads)
    freed = 0
    for folder in folders:
        if not folder.exists():
            continue
        files = [folder] if folder.is_file() else [p for p in folder.rglob("*") if p.is_file()]
        # A hard link frees nothing while another name holds the file (local S3's copy of a channel).
        freed += sum(p.stat().st_size for p in files if not p.is_symlink() and p.stat().st_nlink == 1)
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder, ignore_errors=True)
        else:
            folder.unlink(missing_ok=True)
    return freed


def _released_parts(folder: Path, kept: list[Path]):
    """The files and folders under ``folder`` that are not in ``kept`` and hold none of it."""
    for child in folder.iterdir() if folder.is_dir() else ():
        if child in kept:
            continue
        if any(child in k.parents for k in kept):
            yield from _released_parts(child, kept)
        else:
            yield child


def training_module_for(image: str) -> str | None:
    """The framework module the image's SAGEMAKER_TRAINING_MODULE names.

    PyTorch and Hugging Face DLCs run ``sagemaker_pytorch_container.training:main`` (torchrun,
    DDP, ...). Any other image runs in plain script mode: the toolkit starts ``sagemaker_program``
    with the environment's Python, which is what script-mode framework images do too.
    """
    name = image.rsplit("/", 1)[-1]
    if "pytorch" in name or "huggingface" in name:
        return PYTORCH_TRAINING_MODULE
    return None


def lay_out_hosts(run_dir: Path, job: dict, code_dir: Path | None, channels) -> list[Host]:
    """A fresh /opt/ml tree per host in ``run_dir``: config, code, channels, checkpoint folder."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    hosts = make_hosts(run_dir, instance_groups(job["ResourceConfig"]))
    for host in hosts:
        hyperparameters = dict(job.get("HyperParameters", {}))
        if code_dir is not None:
            # The toolkit cannot reach this process's S3: it gets the code already in place.
            hyperparameters["sagemaker_submit_directory"] = json.dumps(f"{host.base_dir}/code")
            shutil.copytree(code_dir, host.tree / "code")
        write_config(host, hosts, job, hyperparameters)
        host.checkpoints = host.path(job.get("CheckpointConfig", {}).get("LocalPath", "/opt/ml/checkpoints"))
        host.checkpoints.mkdir(parents=True, exist_ok=True)
        # A container's /tmp goes with it; this machine's /tmp stays. What a job leaves there (a model
        # archive unpacked from its channel is hundreds of MB) must go with the job here too.
        host.tmp = run_dir / f"{host.name}-tmp"
        host.tmp.mkdir()
    for channel in channels:  # staging.Channel
        receivers = [h for h in hosts if receives(h, channel.request)]
        for index, host in enumerate(receivers):
            destination = host.tree / "input" / "data" / channel.name
            if not channel.sharded:
                link_or_copy_tree(channel.folder, destination)
                continue
            for path in channel.files[index :: len(receivers)]:  # ShardedByS3Key over the receiving hosts
                target = destination / path.relative_to(channel.folder)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    return hosts
