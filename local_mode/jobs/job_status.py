"""A training job's description as DescribeTrainingJob shows it: statuses, times, billing, metrics.

``JobStatus`` owns the document and saves it on every change. How a job ends is an ``Outcome``:
the process supervision returns one; a step before training that ends the job (a failed
download, a stop while waiting for the machine) raises ``JobEnded``, which carries one.

Billing: ``BillableTimeInSeconds`` equals the training time, except for managed spot jobs where a
nominal ``NOMINAL_SPOT_DISCOUNT`` is applied. Spot savings shown by local mode are simulated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# SageMaker bills managed spot capacity at a discount that varies by instance type and over time
# (up to 90%). Local mode has no spot market: it applies this nominal 70% so that the "savings"
# line reads like SageMaker's; every figure derived from it is simulated.
NOMINAL_SPOT_DISCOUNT = 0.70
TERMINAL_SECONDARY = ("Completed", "Failed", "Stopped", "MaxRuntimeExceeded", "MaxWaitTimeExceeded")
LIMIT_MESSAGES = {
    "MaxRuntimeExceeded": "Job stopped because max run time was exceeded.",
    "MaxWaitTimeExceeded": "Job stopped because max wait time was exceeded.",
}


@dataclass(frozen=True)
class Outcome:
    kind: str  # Completed, Failed, Stopped, Interrupted (spot), MaxRuntimeExceeded, MaxWaitTimeExceeded
    reason: str = ""  # FailureReason for Failed


class JobEnded(Exception):
    """Raised by a step before training that ends the job: ``outcome`` says how."""

    def __init__(self, kind: str, reason: str = ""):
        super().__init__(kind)
        self.outcome = Outcome(kind, reason)


class JobStatus:
    def __init__(self, aws, job: dict):
        self.aws = aws  # local_mode.jobs.aws.LocalAWS
        self.job = job  # the DescribeTrainingJob document
        self.name = job["TrainingJobName"]
        self.final_metrics: dict[str, tuple[float, float]] = {}  # name -> (last value, when)

    def say(self, text: str) -> None:
        self.aws.say(f"job {self.name}: {text}")

    def save(self) -> None:
        self.job["LastModifiedTime"] = time.time()
        self.aws.storage.save_job(self.job)

    def secondary(self, status: str, message: str, primary: str | None = None) -> None:
        now = time.time()
        transitions = self.job["SecondaryStatusTransitions"]
        if transitions and "EndTime" not in transitions[-1]:
            transitions[-1]["EndTime"] = now
        transitions.append({"Status": status, "StartTime": now, "StatusMessage": message})
        self.job["SecondaryStatus"] = status
        if primary:
            self.job["TrainingJobStatus"] = primary
        if status in TERMINAL_SECONDARY:
            transitions[-1]["EndTime"] = now
        self.save()

    def finish(self, outcome: Outcome) -> None:
        """Training time, billable time, final metrics and the last status."""
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
        if self.final_metrics:
            self.job["FinalMetricDataList"] = [
                {"MetricName": name, "Value": value, "Timestamp": t}
                for name, (value, t) in sorted(self.final_metrics.items())
            ]
        kind, reason = outcome.kind, outcome.reason
        if kind == "Completed":
            self.secondary("Completed", "Training job completed", primary="Completed")
        elif kind == "Failed":
            self.job["FailureReason"] = reason[:1024]
            self.secondary("Failed", "Training job failed", primary="Failed")
        elif kind in LIMIT_MESSAGES:
            self.secondary(kind, LIMIT_MESSAGES[kind], primary="Stopped")
        else:
            self.secondary("Stopped", "Training job stopped", primary="Stopped")
        self.say(
            f"{self.job['TrainingJobStatus']} ({self.job['SecondaryStatus']})" + (f": {reason[:300]}" if reason else "")
        )
