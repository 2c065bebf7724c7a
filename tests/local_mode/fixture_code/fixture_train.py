"""A small entry point that exercises the SageMaker container contract in local-mode tests.

--mode steps      a resumable loop: one `step=<n> loss=<x>` line per step, a checkpoint every
                  --checkpoint_every steps in /opt/ml/checkpoints (written before the step's line),
                  the data line count, the final step and the resume step in the model dir; on
                  SIGTERM it saves the step it is in and exits 0 (where the signal reaches it);
                  it leaves a file in its temporary folder and prints ``tmp=<folder>``
--mode allreduce  torch.distributed (gloo) all-reduce of rank+1 over every process; the hosts of
                  --judge_group (an instance group outside the distribution) print a line instead
--mode fail       writes a failure reason and exits 1 (on the host given by --fail_host)
--mode groups     prints one line ``groups {...}``: the host's instance-group environment and the
                  files of each channel it received
"""

import argparse
import json
import os
import signal
import sys
import tempfile
import time

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="steps")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--step_seconds", type=float, default=0.0)
parser.add_argument("--fail_host", default="")
parser.add_argument("--checkpoint_every", type=int, default=1)
parser.add_argument("--judge_group", default="")
args = parser.parse_args()

print(f"fixture started mode={args.mode} host={os.environ.get('SM_CURRENT_HOST')}", flush=True)
model_dir = os.environ["SM_MODEL_DIR"]
base_dir = os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")
checkpoint_dir = os.path.join(base_dir, "checkpoints")
failure_file = os.path.join(os.environ["SM_OUTPUT_DIR"], "failure")

if args.mode == "steps":
    sigterm = []
    signal.signal(signal.SIGTERM, lambda *_: sigterm.append(time.time()))
    state_file = os.path.join(checkpoint_dir, "state.json")
    start = 0
    if os.path.exists(state_file):
        start = json.load(open(state_file))["step"]
        print(f"resumed from step {start}", flush=True)
    with tempfile.NamedTemporaryFile("w", suffix=".scratch", delete=False) as scratch:
        scratch.write("a file a script leaves behind")
    print(f"tmp={tempfile.gettempdir()}", flush=True)
    rows = 0
    if "SM_CHANNEL_TRAIN" in os.environ:
        channel_file = os.path.join(os.environ["SM_CHANNEL_TRAIN"], "train.jsonl")
        with open(channel_file) as f:
            rows = sum(1 for _ in f)
        stat = os.stat(channel_file)
        print(f"channel_file links={stat.st_nlink} mode={stat.st_mode & 0o777:o}", flush=True)
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step_seconds)
        if sigterm or step % args.checkpoint_every == 0:
            with open(state_file + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(state_file + ".tmp", state_file)
        print(f"step={step} loss={1.0 / step:.4f}", flush=True)
        if sigterm:
            print(f"SIGTERM received: saved step {step}, exiting", flush=True)
            sys.exit(0)
    with open(os.path.join(model_dir, "result.json"), "w") as f:
        json.dump({"final_step": args.steps, "resumed_from": start, "rows": rows}, f)
    os.makedirs(os.environ["SM_OUTPUT_DATA_DIR"], exist_ok=True)
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"step": args.steps}) + "\n")

elif args.mode == "allreduce" and os.environ.get("SM_CURRENT_INSTANCE_GROUP") == args.judge_group:
    print(f"judge host={os.environ['SM_CURRENT_HOST']} torchrun_rank={os.environ.get('RANK')}", flush=True)

elif args.mode == "allreduce":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    threads = torch.tensor([float(torch.get_num_threads())])
    dist.all_reduce(threads)  # the compute threads of all hosts together
    if args.fail_host and os.environ.get("SM_CURRENT_HOST", "").endswith(args.fail_host):
        with open(failure_file, "w") as f:
            f.write(f"rank {rank} gave up on purpose")
        os._exit(3)  # dies without leaving the group: the peers would wait forever on their own
    dist.barrier()  # with a dead peer this never returns
    if rank == 0:
        with open(os.path.join(model_dir, "allreduce.json"), "w") as f:
            json.dump(
                {
                    "sum": value.item(),
                    "world_size": dist.get_world_size(),
                    "threads": threads.item(),
                    "hosts": json.loads(os.environ["SM_HOSTS"]),
                },
                f,
            )
        print(f"step=1 sum={value.item()}", flush=True)
    dist.destroy_process_group()

elif args.mode == "fail":
    if not args.fail_host or os.environ.get("SM_CURRENT_HOST", "").endswith(args.fail_host):
        with open(failure_file, "w") as f:
            f.write("the fixture failed on purpose: --mode fail")
        sys.exit(1)

elif args.mode == "groups":
    names = (
        "SM_CURRENT_HOST",
        "SM_CURRENT_INSTANCE_TYPE",
        "SM_CURRENT_INSTANCE_GROUP",
        "SM_CURRENT_INSTANCE_GROUP_HOSTS",
        "SM_INSTANCE_GROUPS",
        "SM_INSTANCE_GROUPS_DICT",
        "SM_HOSTS",
        "SM_IS_HETERO",
        "SM_CHANNELS",
    )
    seen = {name: os.environ.get(name) for name in names}
    seen["files"] = {
        channel: sorted(os.listdir(os.environ[f"SM_CHANNEL_{channel.upper()}"]))
        for channel in json.loads(os.environ["SM_CHANNELS"])
    }
    print("groups " + json.dumps(seen), flush=True)
