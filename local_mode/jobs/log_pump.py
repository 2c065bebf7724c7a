"""A host's output, line by line, into CloudWatch Logs (moto), with ``MetricDefinitions`` applied.

One thread per host reads the toolkit's output until the host closes it. Each line becomes a log
event of the host's stream; each metric definition whose regex matches it records a CloudWatch
metric point and the job's final value of that metric. Other parts of local mode may watch the
lines too (``on_line``: the simulated Spot interruption waits for a step).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

MAX_LOG_EVENT_CHARS = 200_000  # CloudWatch Logs takes events up to 256 KB


class LogPump:
    def __init__(self, aws, status, on_line: Callable[[str], None]):
        self.aws, self.status, self.on_line = aws, status, on_line  # status: job_status.JobStatus
        self.definitions = [
            (d["Name"], re.compile(d["Regex"]))
            for d in status.job["AlgorithmSpecification"].get("MetricDefinitions", [])
        ]

    def start(self, process, stream: str) -> threading.Thread:
        """Pump ``process.stdout`` into ``stream`` on a thread of its own."""
        self.aws.create_log_stream(stream)
        thread = threading.Thread(target=self._pump, args=(process, stream), daemon=True)
        thread.start()
        return thread

    def _pump(self, process, stream: str) -> None:
        job_name = self.status.name
        for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")[:MAX_LOG_EVENT_CHARS]
            now = time.time()
            try:
                self.aws.put_log_event(job_name, stream, int(now * 1000), line)
            except Exception as error:  # keep reading: a host blocked on a full pipe would hang the job
                self.status.say(f"could not record a log line of {stream}: {error!r}")
            for name, regex in self.definitions:
                match = regex.search(line)
                if match:
                    try:
                        value = float(match.group(1))
                        self.status.final_metrics[name] = (value, now)
                        self.aws.put_metric(job_name, name, value, now)
                    except (IndexError, ValueError):
                        continue  # the regex matched without a number: SageMaker skips it too
                    except Exception as error:
                        self.status.say(f"could not record metric {name}: {error!r}")
            self.on_line(line)
        process.stdout.close()
