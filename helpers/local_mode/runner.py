"""A training job's life in local mode: from CreateTrainingJob to Completed, Failed or Stopped.

One thread per job in the process that created it. The thread lays out one /opt/ml tree per host,
starts the real toolkit once per host, pumps every host's output into CloudWatch Logs (moto) and
to disk, applies ``MetricDefinitions`` to each line, syncs checkpoints, and watches the hosts:
the first host that exits non-zero fails the job and the others are stopped (SIGTERM, then
SIGKILL after a grace period), so a job never waits on a peer that died.

Stopping a job (StopTrainingJob, MaxRuntime/MaxWait, a simulated Spot interruption) follows the
image, as SageMaker does: it sends SIGTERM to the container's first process and SIGKILL 120 s
later. In the PyTorch and Hugging Face images that process is ``bash -m
start_with_right_hostname.sh``, which runs the toolkit as a child and traps nothing; the kernel
drops a signal the first process of a PID namespace does not handle, so neither the toolkit
(5.1.4 installs no SIGTERM handler either) nor torchrun nor the script ever sees it. Local mode
therefore sends them nothing and kills every host's processes, at once by default: the script's
view is SageMaker's (no notice, then SIGKILL), only the moment its work stops moves.
For images whose entry point does pass SIGTERM to the script (``SAGEMAKER_LOCAL_SIGTERM_REACHES_SCRIPT``
names them) local mode sends SIGTERM to the processes the toolkit started (the script, or torchrun,
which passes it to its workers), lets the toolkit go on relaying their output, and sends SIGKILL
after ``STOP_GRACE_SECONDS``. ``SAGEMAKER_LOCAL_STOP_GRACE_SECONDS`` sets the grace for both.

One local job runs at a time on a machine: the toolkit fixes torchrun's port at 7777, so two
jobs at once would collide. A machine-wide lock file serializes them (a waiting job shows
``Starting``), which is simpler and more robust than giving each job its own network namespace.

Billing: ``BillableTimeInSeconds`` equals the training time, except for managed spot jobs where a
nominal ``NOMINAL_SPOT_DISCOUNT`` is applied. Spot savings shown by local mode are simulated.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
import traceback
from pathlib import Path

import psutil

from . import hosts as hostlib
from .requirements_check import missing_requirements

# SageMaker bills managed spot capacity at a discount that varies by instance type and over time
# (up to 90%). Local mode has no spot market: it applies this nominal 70% so that the "savings"
# line reads like SageMaker's; every figure derived from it is simulated.
NOMINAL_SPOT_DISCOUNT = 0.70
STOP_GRACE_SECONDS = 10  # SIGTERM -> SIGKILL on stop, spot interruption, limits (SageMaker: 120 s)
SAGEMAKER_STOP_GRACE_SECONDS = 120  # StopTrainingJob: SIGTERM, then SIGKILL after this
GRACE_VARIABLE = "SAGEMAKER_LOCAL_STOP_GRACE_SECONDS"
SIGTERM_REACHES_SCRIPT_VARIABLE = "SAGEMAKER_LOCAL_SIGTERM_REACHES_SCRIPT"
PEER_GRACE_SECONDS = 5  # SIGTERM -> SIGKILL for the hosts left after one failed
CHECKPOINT_SYNC_SECONDS = 5
MAX_LOG_EVENT_CHARS = 200_000  # CloudWatch Logs takes events up to 256 KB
TORCHRUN_PORT = 7777  # sagemaker_training.torch_distributed.MASTER_PORT
PORT_WAIT_SECONDS = 30
PYTORCH_TRAINING_MODULE = "sagemaker_pytorch_container.training:main"
STEP_LINE = re.compile(r"\bstep=(\d+)")

# Jobs run by this process, by name (StopTrainingJob, simulate_spot_interruption).
RUNNING: dict[str, TrainingJob] = {}


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


def sigterm_reaches_script(image: str) -> bool:
    """Whether the image's entry point passes SIGTERM on to the training script.

    SageMaker's PyTorch and Hugging Face images do not (see the module docstring), nor does an
    image whose init forwards the signal to the toolkit only: the toolkit has no handler, dies at
    once and the container ends with it. ``SAGEMAKER_LOCAL_SIGTERM_REACHES_SCRIPT`` is a comma-separated
    list of image names (repository parts, e.g. ``my-trainer``) whose entry point delivers SIGTERM
    to the script's processes and keeps the toolkit alive while they finish (such as a toolkit
    patched to forward it, under tini).
    """
    repository = image.rsplit("/", 1)[-1]
    names = [n.strip() for n in os.environ.get(SIGTERM_REACHES_SCRIPT_VARIABLE, "").split(",") if n.strip()]
    return any(name in repository for name in names)


def stop_grace_seconds(reaches_script: bool) -> float:
    """SIGTERM to SIGKILL. Where nothing in the container sees SIGTERM, waiting only moves the
    moment the work stops, so local mode kills at once unless told otherwise."""
    value = os.environ.get(GRACE_VARIABLE)
    if value is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            raise ValueError(f"{GRACE_VARIABLE}={value!r} is not a number of seconds; "
                             f"unset it or give e.g. {GRACE_VARIABLE}=10") from None
    return float(STOP_GRACE_SECONDS) if reaches_script else 0.0


class _Outcome(Exception):
    def __init__(self, kind: str, reason: str = ""):
        super().__init__(kind)
        self.kind, self.reason = kind, reason


class TrainingJob:
    def __init__(self, aws, job: dict):
        self.aws = aws  # helpers.local_mode.aws.LocalAWS
        self.job = job  # the DescribeTrainingJob document, saved on every change
        self.name = job["TrainingJobName"]
        self.run_dir = aws.storage.run_dir(self.name)
        self._stop = threading.Event()
        self._spot_request: dict | None = None
        self._interrupt = threading.Event()
        self._streams: dict[str, str] = {}
        self._logs_lock = threading.Lock()
        self._final_metrics: dict[str, tuple[float, float]] = {}
        self._training_started = 0.0
        self._processes: list = []
        self._thread = threading.Thread(target=self._main, name=f"local-job-{self.name}", daemon=True)

    # ---- control from the API ------------------------------------------------------------------
    def start(self) -> None:
        RUNNING[self.name] = self
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def request_spot_interruption(self, after_step: int | None, after_seconds: float | None) -> None:
        self._spot_request = {"after_step": after_step, "after_seconds": after_seconds, "since": time.time()}

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # ---- description ---------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        self.aws.say(f"job {self.name}: {text}")

    def _save(self) -> None:
        self.job["LastModifiedTime"] = time.time()
        self.aws.storage.save_job(self.job)

    def _secondary(self, status: str, message: str, primary: str | None = None) -> None:
        now = time.time()
        transitions = self.job["SecondaryStatusTransitions"]
        if transitions and "EndTime" not in transitions[-1]:
            transitions[-1]["EndTime"] = now
        transitions.append({"Status": status, "StartTime": now, "StatusMessage": message})
        self.job["SecondaryStatus"] = status
        if primary:
            self.job["TrainingJobStatus"] = primary
        if status in ("Completed", "Failed", "Stopped", "MaxRuntimeExceeded", "MaxWaitTimeExceeded"):
            transitions[-1]["EndTime"] = now
        self._save()

    # ---- the job -------------------------------------------------------------------------------
    def _main(self) -> None:
        lock_file = None
        try:
            lock_file = self._acquire_machine_lock()
            self._run()
        except _Outcome as outcome:
            self._finish(outcome.kind, outcome.reason)
        except Exception as error:  # a bug or an environment problem: the job must still end
            self._say("local mode failed while running the job:\n" + traceback.format_exc())
            _terminate(self._processes, PEER_GRACE_SECONDS)
            self._finish("Failed", f"ClientError: local mode could not run the job: {error!r}")
        finally:
            if lock_file is not None:
                lock_file.close()
            RUNNING.pop(self.name, None)

    def _acquire_machine_lock(self):
        lock_file = open(Path(tempfile.gettempdir()) / "sagemaker-local-mode.lock", "w")  # noqa: SIM115
        said = False
        while True:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return lock_file
            except BlockingIOError:
                if not said:
                    self._say(
                        "waiting for the local job already running to finish (one at a time: port 7777)"
                    )
                    said = True
                if self._stop_requested():
                    lock_file.close()
                    raise _Outcome("Stopped") from None
                time.sleep(0.2)

    def _stop_requested(self) -> bool:
        stop_file = self.aws.storage.stop_request_path(self.name)
        if stop_file.exists():
            stop_file.unlink(missing_ok=True)
            self._stop.set()
        if self._stop.is_set() and self.job["TrainingJobStatus"] == "InProgress":
            self._secondary("Stopping", "Stopping the training job", primary="Stopping")
        return self._stop.is_set()

    def _run(self) -> None:
        request = self.job
        count = request["ResourceConfig"]["InstanceCount"]
        self._secondary("Starting", "Preparing the instances for training")
        if self._stop_requested():
            raise _Outcome("Stopped")
        hyperparameters = {
            k: json.loads(v) if _is_json(v) else v for k, v in request.get("HyperParameters", {}).items()
        }
        module = training_module_for(request["AlgorithmSpecification"].get("TrainingImage", ""))
        self._say(
            f"{count} host{'s' if count > 1 else ''} ({hostlib.isolation()}), image -> "
            f"{module or 'script mode (sagemaker_program with this Python)'}"
        )
        gpus = _gpu_count()
        self._say(
            f"{gpus} GPU(s) on this machine: SM_NUM_GPUS={gpus}, "
            + (
                f"{gpus} process(es) per host"
                if gpus
                else f"one process per host on CPU (a {request['ResourceConfig']['InstanceType']} has GPUs on SageMaker)"
            )
        )

        if _container_entrypoint(request) and hostlib.isolation() != hostlib.NAMESPACES:
            raise _Outcome(
                "Failed",
                "ClientError: this job sets ContainerEntrypoint (SDK v3's ModelTrainer does), whose scripts "
                f"read the literal /opt/ml; local mode gives each host its own /opt/ml only with {hostlib.NAMESPACES} "
                "(run as root where `unshare` works, as in CI or a container). Here it has "
                f"{hostlib.isolation()}: launch the job with an SDK v2 estimator, or on SageMaker.",
            )
        self._secondary("Downloading", "Downloading input data")
        self.job["TrainingStartTime"] = time.time()
        cache = self.run_dir / "downloads"
        if cache.exists():
            shutil.rmtree(cache)
        code_dir = self._download_code(hyperparameters, cache / "code")
        channels = self._download_channels(cache / "channels", count)

        attempt = 0
        while True:
            attempt += 1
            hosts = self._lay_out_hosts(attempt, count, hyperparameters, code_dir, channels)
            self._restore_checkpoints(hosts)
            if attempt == 1:
                self._secondary("Training", "Training image download completed. Training in progress.")
            else:
                self._secondary("Training", "Training resumed after the Spot interruption.")
            outcome = self._train(hosts)
            self._sync_checkpoints(hosts)
            if outcome.kind != "Interrupted":
                break
            self._secondary("Interrupted", "Training job interrupted due to Spot interruption")
            self._spot_request = None  # one simulated interruption per request
            self._secondary("Restarting", "Restarting training job after Spot interruption")
            self._say("restarting after the simulated Spot interruption, checkpoints restored")
        self._upload_results(hosts, outcome)
        raise outcome

    def _finish(self, kind: str, reason: str = "") -> None:
        now = time.time()
        start = self.job.get("TrainingStartTime")
        if start:
            self.job["TrainingEndTime"] = now
            seconds = max(1, int(round(now - start)))
            self.job["TrainingTimeInSeconds"] = seconds
            if self.job.get("EnableManagedSpotTraining"):
                self.job["BillableTimeInSeconds"] = max(1, int(round(seconds * (1 - NOMINAL_SPOT_DISCOUNT))))
            else:
                self.job["BillableTimeInSeconds"] = seconds
        if self._final_metrics:
            self.job["FinalMetricDataList"] = [
                {"MetricName": name, "Value": value, "Timestamp": t}
                for name, (value, t) in sorted(self._final_metrics.items())
            ]
        if kind == "Completed":
            self._secondary("Completed", "Training job completed", primary="Completed")
        elif kind == "Failed":
            self.job["FailureReason"] = reason[:1024]
            self._secondary("Failed", "Training job failed", primary="Failed")
        elif kind in ("MaxRuntimeExceeded", "MaxWaitTimeExceeded"):
            message = {
                "MaxRuntimeExceeded": "Job stopped because max run time was exceeded.",
                "MaxWaitTimeExceeded": "Job stopped because max wait time was exceeded.",
            }[kind]
            self._secondary(kind, message, primary="Stopped")
        else:
            self._secondary("Stopped", "Training job stopped", primary="Stopped")
        self._say(
            f"{self.job['TrainingJobStatus']} ({self.job['SecondaryStatus']})"
            + (f": {reason[:300]}" if reason else "")
        )

    # ---- downloads and layout ------------------------------------------------------------------
    def _download_code(self, hyperparameters: dict, target: Path) -> Path | None:
        uri = hyperparameters.get("sagemaker_submit_directory")
        if not uri:
            return None
        uri = self._code_channel_uri(str(uri))
        if not uri.startswith("s3://"):
            raise _Outcome(
                "Failed",
                "ClientError: sagemaker_submit_directory must be an s3:// URI or a file in an input channel "
                f"(/opt/ml/input/data/<channel>/...), got {uri!r}.",
            )
        bucket, key = _split_s3(uri)
        body = self._get_object(bucket, key, what="source code (sagemaker_submit_directory)")
        target.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
            tar.extractall(target, filter="data")
        requirements = target / "requirements.txt"
        if requirements.exists():
            missing = missing_requirements(requirements.read_text())
            if missing:
                raise _Outcome(
                    "Failed",
                    "ClientError: local mode never installs packages, and requirements.txt in the source "
                    f"directory asks for what this environment lacks: {', '.join(missing)}. Install them "
                    f"into this Python environment (pip install {' '.join(repr(m) for m in missing)}) "
                    "and run the job again.",
                )
            # Satisfied already; the toolkit would run `pip install -r requirements.txt` otherwise.
            requirements.unlink()
            self._say("requirements.txt satisfied by this environment (not installed again)")
        return target

    def _code_channel_uri(self, uri: str) -> str:
        """With network isolation the SDK ships the code as channel ``code`` and points
        ``sagemaker_submit_directory`` at the file inside the container
        (``/opt/ml/input/data/code/sourcedir.tar.gz``): read it from that channel's S3 source."""
        prefix = "/opt/ml/input/data/"
        if not uri.startswith(prefix):
            return uri
        name, _, relative = uri[len(prefix) :].partition("/")
        for channel in self.job.get("InputDataConfig", []):
            if channel["ChannelName"] == name:
                source = channel["DataSource"]["S3DataSource"]["S3Uri"]
                if source.rstrip("/").endswith("/" + relative):  # the channel is the file itself
                    return source
                return f"{source.rstrip('/')}/{relative}"
        raise _Outcome(
            "Failed",
            f"ClientError: sagemaker_submit_directory is {uri!r}, but the job has no input channel {name!r}.",
        )

    def _download_channels(self, target: Path, host_count: int) -> dict[str, list[Path]]:
        """Every channel downloaded once; per host, the files that host gets (sharding)."""
        channels = {}
        config = self.job.get("InputDataConfig", [])
        if config:
            self._say(f"downloading {len(config)} channel(s): {', '.join(c['ChannelName'] for c in config)}")
        for channel in config:
            source = channel["DataSource"]["S3DataSource"]
            bucket, prefix = _split_s3(source["S3Uri"])
            keys = self.aws.list_keys(bucket, prefix)
            if not keys:
                raise _Outcome(
                    "Failed",
                    f"ClientError: Data download failed: no objects under {source['S3Uri']} for channel "
                    f"'{channel['ChannelName']}'. Upload the data first (sagemaker_session.upload_data).",
                )
            folder = target / channel["ChannelName"]
            for key in keys:
                relative = key[len(prefix) :].lstrip("/") or key.rsplit("/", 1)[-1]
                path = folder / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(self._get_object(bucket, key, what=f"channel '{channel['ChannelName']}'"))
            files = sorted(p for p in folder.rglob("*") if p.is_file())
            if source.get("S3DistributionType") == "ShardedByS3Key":
                channels[channel["ChannelName"]] = [folder, [files[i::host_count] for i in range(host_count)]]
            else:
                channels[channel["ChannelName"]] = [folder, None]
        return channels

    def _get_object(self, bucket: str, key: str, what: str) -> bytes:
        try:
            return self.aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.aws.s3.exceptions.ClientError as error:
            raise _Outcome(
                "Failed", f"ClientError: Data download failed for {what}: s3://{bucket}/{key}: {error}"
            ) from None

    def _lay_out_hosts(self, attempt, count, hyperparameters, code_dir, channels) -> list[hostlib.Host]:
        run_dir = self.run_dir / f"attempt-{attempt}"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        hosts = hostlib.make_hosts(run_dir, count)
        for index, host in enumerate(hosts):
            local_hyperparameters = dict(self.job.get("HyperParameters", {}))
            if code_dir is not None:
                # The toolkit cannot reach this process's S3: it gets the code already in place.
                local_hyperparameters["sagemaker_submit_directory"] = json.dumps(f"{host.base_dir}/code")
                shutil.copytree(code_dir, host.tree / "code")
            hostlib.write_config(host, hosts, self.job, local_hyperparameters)
            for name, (folder, shards) in channels.items():
                destination = host.tree / "input" / "data" / name
                if shards is None:
                    hostlib.link_or_copy_tree(folder, destination)
                else:
                    for path in shards[index]:
                        target = destination / path.relative_to(folder)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(path, target)
            host.checkpoints = host.path(
                self.job.get("CheckpointConfig", {}).get("LocalPath", "/opt/ml/checkpoints")
            )
            host.checkpoints.mkdir(parents=True, exist_ok=True)
        return hosts

    # ---- checkpoints ---------------------------------------------------------------------------
    def _checkpoint_prefix(self) -> tuple[str, str] | None:
        uri = self.job.get("CheckpointConfig", {}).get("S3Uri")
        if not uri:
            return None
        bucket, prefix = _split_s3(uri)
        return bucket, prefix.rstrip("/") + "/" if prefix else ""

    def _restore_checkpoints(self, hosts) -> None:
        target = self._checkpoint_prefix()
        if target is None:
            return
        bucket, prefix = target
        keys = self.aws.list_keys(bucket, prefix)
        for host in hosts:
            for key in keys:
                path = host.checkpoints / key[len(prefix) :]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(self.aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            host.synced = {p: _signature(p) for p in _files_under(host.checkpoints)}
        if keys:
            self._say(f"restored {len(keys)} checkpoint file(s) from s3://{bucket}/{prefix}")

    def _sync_checkpoints(self, hosts) -> None:
        target = self._checkpoint_prefix()
        if target is None:
            return
        bucket, prefix = target
        for host in hosts:
            synced = host.synced
            for path in _files_under(host.checkpoints):
                # The script rotates checkpoints while we look: a file listed here may be gone
                # by the time it is read, and is then simply not uploaded.
                try:
                    signature = _signature(path)
                    if synced.get(path) == signature:
                        continue
                    body = path.read_bytes()
                except FileNotFoundError:
                    continue
                key = prefix + path.relative_to(host.checkpoints).as_posix()
                self.aws.s3.put_object(Bucket=bucket, Key=key, Body=body)
                synced[path] = signature
            host.synced = synced

    # ---- the hosts -------------------------------------------------------------------------------
    def _train(self, hosts) -> _Outcome:
        processes, pumps, outcome = self._watch(hosts)
        for pump in pumps:
            pump.join(timeout=10)  # the last lines reach the logs before the job is reported done
        return outcome

    def _wait_for_torchrun_port(self) -> None:
        """torchrun's rendezvous listens on port 7777 (fixed by the toolkit) on algo-1."""
        deadline = time.time() + PORT_WAIT_SECONDS
        said = False
        while (holder := _port_holder(TORCHRUN_PORT)) is not None:
            if time.time() > deadline:
                raise _Outcome(
                    "Failed",
                    f"ClientError: port {TORCHRUN_PORT}, where the training toolkit starts torchrun's "
                    f"rendezvous on algo-1, is taken on this machine by {holder}. Stop that process and "
                    "run the job again.",
                )
            if not said:
                self._say(f"port {TORCHRUN_PORT} is taken by {holder}; waiting up to {PORT_WAIT_SECONDS}s")
                said = True
            if self._stop_requested():
                raise _Outcome("Stopped")
            time.sleep(0.5)

    def _watch(self, hosts):
        if len(hosts) > 1:
            self._wait_for_torchrun_port()
        module = training_module_for(self.job["AlgorithmSpecification"].get("TrainingImage", ""))
        processes, pumps = [], []
        self._processes = processes  # stopped by _main if local mode itself fails mid-job
        for host in hosts:
            stream = self._streams.setdefault(host.name, f"{self.name}/{host.name}-{int(time.time())}")
            self.aws.create_log_stream(stream)
            environment = hostlib.host_environment(host, self.job, self.aws.region, module)
            entrypoint = _container_entrypoint(self.job)
            if entrypoint:
                # Local mode never installs packages; an entry point that runs pip (ModelTrainer's
                # requirements) may only find them satisfied in this environment.
                environment["PIP_NO_INDEX"] = "1"
            process = hostlib.start_host(host, host.tree.parents[2], environment, entrypoint)
            processes.append(process)
            pumps.append(threading.Thread(target=self._pump, args=(process, stream), daemon=True))
            pumps[-1].start()
        self._training_started = time.time()
        self._say(f"training on {len(hosts)} host(s): {', '.join(h.name for h in hosts)}")

        stopping = self.job["StoppingCondition"]
        runtime_deadline = self._training_started + stopping.get("MaxRuntimeInSeconds", 86400)
        wait_deadline = self.job["CreationTime"] + stopping.get("MaxWaitTimeInSeconds", 10**9)
        last_sync = time.time()
        while True:
            codes = [p.poll() for p in processes]
            failed = [(h, c) for h, c in zip(hosts, codes, strict=True) if c not in (None, 0)]
            if failed:
                host, code = failed[0]
                self._say(f"{host.name} exited with code {code}: stopping the other hosts")
                _terminate(processes, PEER_GRACE_SECONDS)
                return processes, pumps, _Outcome("Failed", _failure_reason(host, code))
            if all(c == 0 for c in codes):
                return processes, pumps, _Outcome("Completed")
            reason = None
            if self._stop_requested():
                reason = _Outcome("Stopped")
            elif self._spot_due():
                self._say("simulated Spot interruption")
                reason = _Outcome("Interrupted")
            elif time.time() > runtime_deadline:
                reason = _Outcome("MaxRuntimeExceeded")
            elif self.job.get("EnableManagedSpotTraining") and time.time() > wait_deadline:
                reason = _Outcome("MaxWaitTimeExceeded")
            if reason is not None:
                self._stop_as_the_image_would(processes)
                return processes, pumps, reason
            if time.time() - last_sync > CHECKPOINT_SYNC_SECONDS:
                self._sync_checkpoints(hosts)
                last_sync = time.time()
            time.sleep(0.05)

    def _stop_as_the_image_would(self, processes) -> None:
        """SIGTERM where SageMaker sends it (the container's first process), then SIGKILL."""
        image = self.job["AlgorithmSpecification"].get("TrainingImage", "")
        reaches_script = sigterm_reaches_script(image)
        grace = stop_grace_seconds(reaches_script)
        kill = f"SIGKILL after {grace:g} s" if grace else "SIGKILL at once"
        if reaches_script:
            self._say(f"SIGTERM to the training processes ({SIGTERM_REACHES_SCRIPT_VARIABLE}: the image's entry "
                      f"point passes it on); {kill} (SageMaker: after {SAGEMAKER_STOP_GRACE_SECONDS} s)")
            _signal_training_processes(processes, signal.SIGTERM)
        else:
            self._say(f"SIGTERM to the container's first process, which passes it to nothing (PyTorch/Hugging Face "
                      f"images: bash -m start_with_right_hostname.sh, no trap): the script gets no notice; {kill} "
                      f"(SageMaker: after {SAGEMAKER_STOP_GRACE_SECONDS} s; {GRACE_VARIABLE} to wait here too)")
        _kill_after(processes, grace)

    def _spot_due(self) -> bool:
        request = self._spot_request
        if request is None:
            return False
        if self._interrupt.is_set():
            return True
        if request["after_seconds"] is not None:
            return time.time() >= max(request["since"], self._training_started) + request["after_seconds"]
        return request["after_step"] is None

    def _pump(self, process: subprocess.Popen, stream: str) -> None:
        definitions = [
            (d["Name"], re.compile(d["Regex"]))
            for d in self.job["AlgorithmSpecification"].get("MetricDefinitions", [])
        ]
        for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")[:MAX_LOG_EVENT_CHARS]
            now = time.time()
            try:
                self.aws.put_log_event(self.name, stream, int(now * 1000), line)
            except Exception as error:  # keep reading: a host blocked on a full pipe would hang the job
                self._say(f"could not record a log line of {stream}: {error!r}")
            for name, regex in definitions:
                match = regex.search(line)
                if match:
                    try:
                        value = float(match.group(1))
                        self._final_metrics[name] = (value, now)
                        self.aws.put_metric(self.name, name, value, now)
                    except (IndexError, ValueError):
                        continue  # the regex matched without a number: SageMaker skips it too
                    except Exception as error:
                        self._say(f"could not record metric {name}: {error!r}")
            request = self._spot_request
            if request is not None and request["after_step"] is not None:
                step = STEP_LINE.search(line)
                if step and int(step.group(1)) >= request["after_step"]:
                    self._interrupt.set()
        process.stdout.close()

    # ---- results -------------------------------------------------------------------------------
    def _upload_results(self, hosts, outcome: _Outcome) -> None:
        if outcome.kind in ("Completed", "Stopped", "MaxRuntimeExceeded", "MaxWaitTimeExceeded"):
            self._secondary("Uploading", "Uploading generated training model")
        leader = hosts[0]  # algo-1: the leader's /opt/ml/model and /opt/ml/output/data are kept
        bucket, prefix = _split_s3(self.job["OutputDataConfig"]["S3OutputPath"])
        base = "/".join(p for p in (prefix.rstrip("/"), self.name, "output") if p)
        output = _tar_gz(leader.tree / "output" / "data")
        self.aws.s3.put_object(Bucket=bucket, Key=f"{base}/output.tar.gz", Body=output)
        if outcome.kind != "Failed":
            model = _tar_gz(leader.tree / "model")
            self.aws.s3.put_object(Bucket=bucket, Key=f"{base}/model.tar.gz", Body=model)
            self.job["ModelArtifacts"] = {"S3ModelArtifacts": f"s3://{bucket}/{base}/model.tar.gz"}
            self._say(f"model uploaded to s3://{bucket}/{base}/model.tar.gz ({len(model)} bytes)")


def _container_entrypoint(job: dict) -> list[str] | None:
    """The request's ContainerEntrypoint + ContainerArguments: they replace the image's entry point
    (the toolkit), as in SageMaker."""
    algorithm = job["AlgorithmSpecification"]
    if not algorithm.get("ContainerEntrypoint"):
        return None
    return [*algorithm["ContainerEntrypoint"], *algorithm.get("ContainerArguments", [])]


def _is_json(value: str) -> bool:
    try:
        json.loads(value)
        return True
    except (TypeError, ValueError):
        return False


def _split_s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


def _files_under(folder: Path) -> list[Path]:
    """Files below ``folder``, sorted; folders removed during the walk are skipped."""
    files = []
    for root, _dirs, names in os.walk(folder):
        files.extend(Path(root) / name for name in names)
    return sorted(files)


def _signature(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def _tar_gz(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        if folder.exists():
            for path in sorted(folder.iterdir()):
                tar.add(path, arcname=path.name)
    return buffer.getvalue()


def _failure_reason(host: hostlib.Host, code: int) -> str:
    failure = host.tree / "output" / "failure"
    text = failure.read_text(errors="replace").strip() if failure.exists() else ""
    return f"AlgorithmError: {text or f'{host.name} exited with code {code} and wrote no failure reason'}"


def _port_holder(port: int) -> str | None:
    """Who listens on the port ("pid N (command)"), or None when it is free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
            return None
        except OSError:
            pass
    for connection in psutil.net_connections(kind="tcp"):
        if connection.laddr and connection.laddr.port == port and connection.status == psutil.CONN_LISTEN:
            try:
                return f"pid {connection.pid} ({' '.join(psutil.Process(connection.pid).cmdline())[:120]})"
            except (psutil.Error, TypeError):
                break
    return "another process"


def _gpu_count() -> int:
    """What the toolkit will find (it runs `nvidia-smi --list-gpus` too)."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def _signal_training_processes(processes, signum: int) -> None:
    """Signal what each host's toolkit started (the script, or torchrun), not the toolkit itself."""
    for process in processes:
        try:
            children = psutil.Process(process.pid).children(recursive=False)
        except psutil.NoSuchProcess:
            continue
        for child in children:
            try:
                child.send_signal(signum)
            except psutil.NoSuchProcess:
                pass


def _process_trees(processes) -> list[psutil.Process]:
    """Every host's process and its descendants."""
    tree = []
    for process in processes:
        try:
            parent = psutil.Process(process.pid)
            tree += [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return tree


def _kill(tree: list[psutil.Process], processes) -> None:
    """SIGKILL ``tree`` and the hosts' process groups, and reap the hosts."""
    for member in tree:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()


def _kill_after(processes, grace: float) -> None:
    """Wait up to ``grace`` seconds for every host's toolkit to exit, then SIGKILL whatever is left
    of the hosts' processes: when its first process goes, a container ends with everything in it."""
    tree = _process_trees(processes)  # taken first: a toolkit that exits leaves its children orphans
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.05)
    _kill(tree + _process_trees(processes), processes)


def _terminate(processes: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every host's process tree, SIGKILL what is left after `grace` seconds."""
    tree = _process_trees(processes)
    for process in processes:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for member in tree:
        try:
            member.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=grace)
    _kill(alive, processes)
