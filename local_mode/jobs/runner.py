"""A training job's life in local mode: from CreateTrainingJob to Completed, Failed or Stopped.

One thread per job in the process that created it, in this order:

1. wait for the machine (machine_lock.py: one local job at a time);
2. download the source directory and the channels once (staging.py);
3. lay out one /opt/ml tree per host (hosts.py) and restore checkpoints into it (checkpoints.py);
4. run the hosts until the job ends (processes.py: start, watch, stop, Spot interruption; the
   output reaches the logs through log_pump.py); after a simulated Spot interruption, go back to 3;
5. upload model.tar.gz and output.tar.gz (outputs.py) and record the end (job_status.py).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import traceback

from local_mode.os_utils import gpu_count

from . import checkpoints, outputs, staging
from . import hosts as hostlib
from .job_status import JobEnded, JobStatus, Outcome
from .machine_lock import machine_lock
from .processes import PEER_GRACE_SECONDS, SpotInterruption, Supervisor

# Jobs run by this process, by name (StopTrainingJob, simulate_spot_interruption).
RUNNING: dict[str, TrainingJob] = {}


class TrainingJob:
    def __init__(self, aws, job: dict):
        self.aws = aws  # local_mode.jobs.aws.LocalAWS
        self.job = job  # the DescribeTrainingJob document, saved on every change
        self.name = job["TrainingJobName"]
        self.run_dir = aws.storage.run_dir(self.name)
        self.status = JobStatus(aws, job)
        self.spot = SpotInterruption()
        self._stop = threading.Event()
        self._supervisor = Supervisor(aws, self.status, self.spot, self._stop_requested)
        self._thread = threading.Thread(target=self._main, name=f"local-job-{self.name}", daemon=True)

    # ---- control from the API ------------------------------------------------------------------
    def start(self) -> None:
        RUNNING[self.name] = self
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def request_spot_interruption(self, after_step: int | None, after_seconds: float | None) -> None:
        self.spot.request(after_step, after_seconds)

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _stop_requested(self) -> bool:
        """StopTrainingJob from this process (``stop``) or from another one (the stop-request file)."""
        stop_file = self.aws.storage.stop_request_path(self.name)
        if stop_file.exists():
            stop_file.unlink(missing_ok=True)
            self._stop.set()
        if self._stop.is_set() and self.job["TrainingJobStatus"] == "InProgress":
            self.status.secondary("Stopping", "Stopping the training job", primary="Stopping")
        return self._stop.is_set()

    # ---- the job -------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            with machine_lock(self.status.say, self._stop_requested):
                self.status.finish(self._outcome())  # before the lock goes: the next job waits for it
        except JobEnded as ended:  # stopped while waiting for the machine
            self.status.finish(ended.outcome)
        except Exception as error:  # the lock itself failed
            self.status.finish(self._local_mode_failed(error))
        finally:
            RUNNING.pop(self.name, None)

    def _outcome(self) -> Outcome:
        try:
            return self._run()
        except JobEnded as ended:
            return ended.outcome
        except Exception as error:
            return self._local_mode_failed(error)

    def _local_mode_failed(self, error: Exception) -> Outcome:
        """A bug or an environment problem: the job must still end, and its hosts with it."""
        self.status.say("local mode failed while running the job:\n" + traceback.format_exc())
        self._supervisor.terminate(PEER_GRACE_SECONDS)
        return Outcome("Failed", f"ClientError: local mode could not run the job: {error!r}")

    def _run(self) -> Outcome:
        job, status = self.job, self.status
        groups = hostlib.instance_groups(job["ResourceConfig"])
        count = sum(g["InstanceCount"] for g in groups)
        status.secondary("Starting", "Preparing the instances for training")
        if self._stop_requested():
            return Outcome("Stopped")
        module = hostlib.training_module_for(job["AlgorithmSpecification"].get("TrainingImage", ""))
        status.say(
            f"{count} host{'s' if count > 1 else ''} ({hostlib.isolation()}; "
            + ", ".join(f"{g['InstanceGroupName']}: {g['InstanceCount']} x {g['InstanceType']}" for g in groups)
            + f"), image -> {module or 'script mode (sagemaker_program with this Python)'}"
        )
        gpus, instance = gpu_count(), groups[0]["InstanceType"]
        on_sagemaker = "has GPUs" if instance.startswith(("ml.p", "ml.g")) else "has none either"  # P and G: NVIDIA
        status.say(
            f"{gpus} GPU(s) on this machine: SM_NUM_GPUS={gpus}, "
            + (
                f"{gpus} process(es) per host"
                if gpus
                else f"one process per host on CPU (a {instance} {on_sagemaker} on SageMaker)"
            )
        )

        if hostlib.container_entrypoint(job) and hostlib.isolation() != hostlib.NAMESPACES:
            raise JobEnded(
                "Failed",
                "ClientError: this job sets ContainerEntrypoint (SDK v3's ModelTrainer does), whose scripts "
                f"read the literal /opt/ml; local mode gives each host its own /opt/ml only with {hostlib.NAMESPACES} "
                "(run as root where `unshare` works, as in CI or a container). Here it has "
                f"{hostlib.isolation()}: launch the job with an SDK v2 estimator, or on SageMaker.",
            )
        status.secondary("Downloading", "Downloading input data")
        job["TrainingStartTime"] = time.time()
        cache = self.run_dir / "downloads"
        if cache.exists():
            shutil.rmtree(cache)
        hyperparameters = {k: _decoded(v) for k, v in job.get("HyperParameters", {}).items()}
        code_dir = staging.download_code(self.aws, job, hyperparameters, cache / "code", status.say)
        channels = staging.download_channels(self.aws, job, cache / "channels", status.say)

        attempt = 0
        while True:
            attempt += 1
            hosts = hostlib.lay_out_hosts(self.run_dir / f"attempt-{attempt}", job, code_dir, channels)
            checkpoints.restore(self.aws, job, hosts, status.say)
            if attempt == 1:
                status.secondary("Training", "Training image download completed. Training in progress.")
            else:
                status.secondary("Training", "Training resumed after the Spot interruption.")
            try:
                outcome = self._supervisor.run(hosts, module)
            finally:
                for host in hosts:
                    shutil.rmtree(host.tmp, ignore_errors=True)
            checkpoints.sync(self.aws, job, hosts)
            if outcome.kind != "Interrupted":
                break
            hostlib.release_instances(hosts)  # the interrupted instances are gone; the checkpoints are in S3
            status.secondary("Interrupted", "Training job interrupted due to Spot interruption")
            self.spot.clear()
            status.secondary("Restarting", "Restarting training job after Spot interruption")
            status.say("restarting after the simulated Spot interruption, checkpoints restored")
        outputs.upload_results(self.aws, status, hosts[0], outcome)  # algo-1's model and output data
        freed = hostlib.release_instances(hosts, cache / "channels")
        if freed:
            status.say(
                f"freed {freed / 1e6:.1f} MB of instance storage (model, checkpoints, channels): as on SageMaker, "
                "what the job saved is in S3"
            )
        return outcome


def _decoded(value: str):
    """A hyperparameter as the SDK meant it: SageMaker hands them over JSON-encoded."""
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value
