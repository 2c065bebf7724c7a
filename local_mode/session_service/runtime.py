"""The runtime of the training-session API: operations on a Running session, in order.

Training operations (forward, forwardBackward, optimizerStep, saveWeights, saveState, loadState) run
strictly by sequence number on the session's own thread; sampling operations (sample,
computeLogprobs, loadWeightsForSampling) are unordered and run one at a time. What would fail
mid-operation is refused at submit, so that a refused request leaves the session as it was and
takes no sequence number.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Protocol

from local_mode.storage import split_s3
from local_mode.validation import ServiceError

from . import chat
from . import engine as engine_module
from .profile import phase


class SessionRecords(Protocol):
    """What the runtime needs of the control plane (control_plane.py), and all it may call: the
    sessions' records and packages, and billing. The control plane in turn knows nothing of the
    runtime but the ``go_live`` it is given."""

    aws: object
    live: dict[str, LiveSession]

    def load(self, name: str) -> dict: ...
    def save(self, detail: dict) -> None: ...
    def bill(self, live: LiveSession, usage: dict) -> None: ...
    def package(self, arn: str) -> dict: ...
    def register_package(self, live: LiveSession, s3_uri: str, checkpoint: bool, description: str) -> dict: ...
    def base_model_for_arn(self, arn: str) -> tuple[str, dict]: ...
    def base_models(self) -> dict[str, dict]: ...


LONG_POLL_SECONDS = float(os.environ.get("SAGEMAKER_LOCAL_SESSION_LONG_POLL", "20"))
TIMING_LOG = os.environ.get("SAGEMAKER_LOCAL_SESSION_TIMING_LOG")


def parameters(sequence: int | None, kind: str, config: dict) -> str:
    """What a retry under the same clientToken must repeat exactly."""
    return json.dumps([sequence, kind, config], sort_keys=True)


class Operation:
    def __init__(self, kind: str, config: dict, sequence: int | None = None, token: str | None = None):
        self.id = uuid.uuid4().hex
        self.kind, self.config, self.sequence, self.token = kind, config, sequence, token
        self.parameters = parameters(sequence, kind, config)
        self.status = "Pending"
        self.result: dict | None = None
        self.error: str | None = None
        self.tokens = 0
        self.done = threading.Event()
        self.finished_at: float | None = None

    def answer(self) -> dict:
        response = {"status": self.status}
        if self.result is not None:
            response["operationResult"] = {self.kind: self.result}
        if self.error is not None:
            response["errorDetails"] = self.error
        if self.tokens and self.sequence is not None:
            response["tokenUsage"] = {"trainingTokens": self.tokens}
        return response


class LiveSession:
    """A Running session: its engine, its operations, and the thread that runs them in order."""

    def __init__(self, runtime: Runtime, detail: dict, engine: engine_module.Engine):
        self.runtime, self.detail, self.engine = runtime, detail, engine
        self.name = detail["TrainingSessionName"]
        # Read from the loaded model's configuration: what requests are checked against at submit.
        self.vocabulary = engine.model.get_input_embeddings().num_embeddings
        self.context = engine.model.config.max_position_embeddings
        self.operations: dict[str, Operation] = {}
        self.by_sequence: dict[int, Operation] = {}
        self.by_token: dict[str, Operation] = {}
        self.next_sequence = 1
        self.cond = threading.Condition()
        self.closed = False
        self.last_activity = time.time()
        self.package_engines: dict[str, engine_module.Engine] = {}
        threading.Thread(target=self._run_training, name=f"session-{self.name}", daemon=True).start()

    # ---- submission
    def submit_training(self, sequence: int, token: str | None, kind: str, config: dict) -> Operation:
        with self.cond:
            if token is not None and token in self.by_token:
                first = self.by_token[token]
                if first.parameters != parameters(sequence, kind, config):
                    raise ServiceError(
                        "ConflictException",
                        f"clientToken {token} was used by operation {first.id} (sequence number {first.sequence}) "
                        "with other parameters: a retry resends the same request under its token; give a new "
                        "operation a new clientToken.",
                        status=409,
                    )
                return first  # a retried submit: the first operation answers
            if sequence in self.by_sequence:
                first = self.by_sequence[sequence]
                raise ServiceError(
                    "ConflictException",
                    f"Sequence number {sequence} is already used by operation {first.id} of training session "
                    f"{self.name}; send each operation with the next number "
                    f"(LastReceivedSequenceNumber is {self.detail.get('LastReceivedSequenceNumber', 0)}), "
                    "or resend with the same clientToken to get the first operation back.",
                    status=409,
                )
            if sequence < self.next_sequence:
                raise ServiceError(
                    "ConflictException",
                    f"Sequence number {sequence} has already run in training session {self.name}; the next one "
                    f"expected is {self.next_sequence}.",
                    status=409,
                )
            operation = Operation(kind, config, sequence, token)
            self.operations[operation.id] = operation
            self.by_sequence[sequence] = operation
            if token is not None:
                self.by_token[token] = operation
            last = max(self.detail.get("LastReceivedSequenceNumber") or 0, sequence)
            self.detail["LastReceivedSequenceNumber"] = last
            self.last_activity = time.time()
            self.cond.notify_all()
        self.runtime.control_plane.save(self.detail)
        return operation

    def submit_sampling(self, kind: str, config: dict) -> Operation:
        operation = Operation(kind, config)
        self.operations[operation.id] = operation
        self.last_activity = time.time()
        threading.Thread(target=self._run_sampling, args=(operation,), daemon=True).start()
        return operation

    # ---- execution
    def _run_training(self) -> None:
        while True:
            with self.cond:
                while not self.closed and self.next_sequence not in self.by_sequence:
                    self.cond.wait()  # a gap waits for the operation that fills it
                if self.closed:
                    for op in self.by_sequence.values():
                        if not op.done.is_set():
                            self._finish(
                                op,
                                "Skipped",
                                error=f"Training session {self.name} stopped before this operation ran.",
                            )
                    return
                operation = self.by_sequence[self.next_sequence]
            self._execute(operation, self.runtime.run_training_operation)
            with self.cond:
                self.next_sequence += 1

    def _run_sampling(self, operation: Operation) -> None:
        # Not one at a time: the engine's sampling queue runs the requests in flight in shared passes.
        self._execute(operation, self.runtime.run_sampling_operation)

    def _execute(self, operation: Operation, run) -> None:
        operation.status = "InProgress"
        try:
            with phase(f"operation:{operation.kind}"):
                result, usage = run(self, operation)
        except (engine_module.InputError, ServiceError) as error:
            self._finish(operation, "Failed", error=getattr(error, "message", str(error)))
        except Exception as error:  # noqa: BLE001 - reported on the operation, the session carries on
            self._finish(operation, "Failed", error=f"{type(error).__name__}: {error}")
        else:
            if operation.sequence is not None:
                operation.tokens = usage.get("TrainingTokenCount", 0)
            self.runtime.control_plane.bill(self, usage)
            self._finish(operation, "Completed", result=result)

    def _finish(self, operation: Operation, status: str, result=None, error=None) -> None:
        operation.result, operation.error, operation.status = result, error, status
        operation.finished_at = time.time()
        self.last_activity = time.time()
        operation.done.set()
        if TIMING_LOG:  # for bench.training_sessions: when each operation ended, on this machine's clock
            with open(TIMING_LOG, "a") as log:
                log.write(f"{operation.id} {operation.finished_at:.6f}\n")

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.engine = None
        self.package_engines = {}


class Runtime:
    """The runtime's operations (ExecuteTrainingOperation, ExecuteSamplingOperation and their
    results) on the Running sessions of ``control_plane``, and the artifacts they save and load."""

    def __init__(self, control_plane: SessionRecords):
        self.control_plane = control_plane
        self.aws = control_plane.aws
        self.lock = threading.RLock()
        self._adapters: dict[str, dict] = {}

    def go_live(self, detail: dict, engine: engine_module.Engine) -> LiveSession:
        """A session the control plane has just loaded, ready to run operations here."""
        return LiveSession(self, detail, engine)

    def _live(self, name: str) -> LiveSession:
        detail = self.control_plane.load(name)
        live = self.control_plane.live.get(name)
        if live is None:
            extra = f" ({detail['ErrorDetails']})" if detail.get("ErrorDetails") else ""
            raise ServiceError(
                "ConflictException",
                f"Training session {name} is {detail['TrainingSessionStatus']}{extra}: operations run only on a "
                "Running session. Create a new one (from a checkpoint with create_training_client_from_state).",
                status=409,
            )
        return live

    def execute_training_operation(self, request: dict) -> dict:
        live = self._live(request["trainingSessionName"])
        kind, config = _union(request["operationConfig"], "operationConfig")
        if kind in ("forward", "forwardBackward"):  # refused now, not when it runs: the session stays as it was
            try:
                engine_module.check_loss_config(config["lossFnName"], config.get("lossFnConfig"))
                check_datums(live, config["datumList"], config["lossFnName"])
            except engine_module.InputError as error:
                raise ServiceError("ValidationException", str(error)) from None
        if kind == "loadState":
            self.package_for(live, config["modelPackageArn"])
        if kind in ("saveWeights", "saveState") and not live.detail.get("ModelPackageGroupArn"):
            raise ServiceError(
                "ValidationException",
                f"Training session {live.name} has no ModelPackageGroupArn: {kind} registers what it saves as a "
                "model package in that group. Create a group (CreateModelPackageGroup) and a session that names it.",
            )
        operation = live.submit_training(request["sequenceNumber"], request.get("clientToken"), kind, config)
        return {"operationId": operation.id}

    def execute_sampling_operation(self, request: dict) -> dict:
        live = self._live(request["trainingSessionName"])
        kind, config = _union(request["operationConfig"], "operationConfig")
        if config.get("modelPackageArn"):
            self.package_for(live, config["modelPackageArn"])
        prompt = config.get("prompt")
        if prompt is not None:
            try:
                tokens = engine_module.model_input_tokens(prompt, "prompt")
                check_token_ids(tokens, live.vocabulary, "prompt")
                # A sample needs room for one new token; a prompt to score may fill the context.
                room = live.context - (kind == "sample")
                if len(tokens) > room:
                    raise engine_module.InputError(
                        f"prompt has {len(tokens)} tokens, more than the model's context of {live.context} "
                        f"allows ({room} for {kind}): shorten the prompt."
                    )
            except engine_module.InputError as error:
                raise ServiceError("ValidationException", str(error)) from None
        return {"operationId": live.submit_sampling(kind, config).id}

    def operation_result(self, request: dict) -> dict:
        name = request["trainingSessionName"]
        live = self.control_plane.live.get(name)
        operation = live.operations.get(request["operationId"]) if live else None
        if operation is None:
            self.control_plane.load(name)
            raise ServiceError(
                "ResourceNotFoundException",
                f"Operation {request['operationId']} does not exist in training session {name}.",
                status=404,
            )
        # Held until the operation ends (or LONG_POLL_SECONDS pass): the SDK polls every 2 s, so an
        # immediate "InProgress" would add up to 2 s to every result().
        operation.done.wait(LONG_POLL_SECONDS)
        return operation.answer()

    def run_training_operation(self, live: LiveSession, operation: Operation) -> tuple[dict, dict]:
        engine, config = live.engine, operation.config
        if operation.kind in ("forward", "forwardBackward"):
            backward = operation.kind == "forwardBackward"
            result, tokens = engine.forward_backward(
                config["lossFnName"], config["datumList"], config.get("lossFnConfig"), backward
            )
            return result, {"TrainingTokenCount" if backward else "PrefillTokenCount": tokens}
        if operation.kind == "optimizerStep":
            return engine.optim_step(config["adamParamsConfig"]), {}
        if operation.kind in ("saveWeights", "saveState"):
            return self._save(live, operation), {}
        if operation.kind == "loadState":
            package = self.control_plane.package(config["modelPackageArn"])
            self._load_package(live, package, bool(config["loadOptimizer"]))
            return {}, {}
        raise ServiceError("ValidationException", f"Unknown training operation {operation.kind}.")

    def run_sampling_operation(self, live: LiveSession, operation: Operation) -> tuple[dict, dict]:
        """Sampling and scoring read a saved model package's weights, or the base model when none is
        named: SageMaker's SDK documents ``model_package_arn=""`` as the base model (Tinker samples
        only saved weights too), so the adapter being trained is never sampled mid-step."""
        engine, config = live.engine, operation.config
        if operation.kind == "loadWeightsForSampling":
            self._adapter_of(self.control_plane.package(config["modelPackageArn"]))
            return {}, {}
        package = self.control_plane.package(config["modelPackageArn"]) if config.get("modelPackageArn") else None
        adapter = self._adapter_of(package) if package is not None else None  # None: the base model
        if package is not None and package["_lora"]["Rank"] != live.detail["LoraConfig"]["Rank"]:
            engine = self._package_engine(live, package)  # another rank: its own model, cached
        tokens = engine_module.model_input_tokens(config["prompt"], "prompt")
        if operation.kind == "computeLogprobs":
            return {"logprobs": engine.compute_logprobs(tokens, adapter)}, {"PrefillTokenCount": len(tokens)}
        samples = engine.sample(tokens, config["numSamples"], config["samplingParams"], adapter)
        result = {"sequences": samples}
        if config.get("includePromptLogprobs"):
            result["promptLogprobs"] = engine.compute_logprobs(tokens, adapter)
        usage = {
            "PrefillTokenCount": len(tokens) * config["numSamples"],
            "SampleTokenCount": sum(len(s["tokens"]) for s in samples),
        }
        return result, usage

    def sample_chat(self, name: str, body: bytes, content_type: str | None, package_arn: str | None):
        """SampleTrainingSession[WithResponseStream]: the chat body answered by the session's model as it
        is now, or by the saved model package ``package_arn`` names. Returns (content type, the answer's
        parts): one part, or a chat.completion.chunk event per part when the body asks to stream."""
        live = self._live(name)
        request = chat.read_chat_request(body, content_type)
        engine, adapter = live.engine, engine_module.OWN_ADAPTER
        if package_arn:
            package = self.package_for(live, package_arn)
            adapter = self._adapter_of(package)
            if package["_lora"]["Rank"] != live.detail["LoraConfig"]["Rank"]:
                engine = self._package_engine(live, package)
        tokens = chat.prompt_tokens(engine.tokenizer, request["messages"])
        if len(tokens) >= live.context:
            raise ServiceError(
                "ValidationException",
                f"The model could not read the request body: the messages take {len(tokens)} tokens, and the "
                f"model's context of {live.context} leaves no room for an answer. Send fewer or shorter messages.",
            )
        params = chat.sampling_params(request)
        params["maxTokens"] = min(params["maxTokens"], live.context - len(tokens))  # the context's room, as vLLM
        try:
            samples = engine.sample(tokens, request["n"], params, adapter)
        except engine_module.InputError as error:
            raise ServiceError("ValidationException", f"The model could not read the request body: {error}") from None
        self.control_plane.bill(
            live,
            {
                "PrefillTokenCount": len(tokens) * request["n"],
                "SampleTokenCount": sum(len(s["tokens"]) for s in samples),
            },
        )
        model = request["model"] or live.detail["ModelConfig"]["BaseModelArn"]
        answer = chat.completion(request, samples, engine.tokenizer, model, len(tokens))
        if request["stream"]:
            return "text/event-stream", chat.stream_events(answer, engine.tokenizer, samples)
        return "application/json", iter([json.dumps(answer).encode()])

    def package_for(self, live: LiveSession, arn: str) -> dict:
        """The model package ``arn`` names, if it was trained from ``live``'s base model. A package holds a
        LoRA adapter of its base model's layers: on another base model of the same shapes it would load
        without a complaint and score every token with weights that belong to neither model."""
        package = self.control_plane.package(arn)
        trained_from = package["InferenceSpecification"]["Containers"][0]["BaseModel"]["HubContentName"]
        session_base, entry = self.control_plane.base_model_for_arn(live.detail["ModelConfig"]["BaseModelArn"])
        if trained_from != session_base:
            known = self.control_plane.base_models().get(trained_from, {}).get("HuggingfaceId", trained_from)
            raise ServiceError(
                "ValidationException",
                f"Model package {arn} was trained from base model {known}; training session {live.name} runs "
                f"base model {entry['HuggingfaceId']}. A checkpoint's LoRA weights apply only to the base model "
                f"they were trained from: give a checkpoint trained from {entry['HuggingfaceId']}, or use this "
                f"one in a session of {known} (create_training_client_from_state reads the base model from the "
                "package).",
            )
        return package

    def _package_engine(self, live: LiveSession, package: dict) -> engine_module.Engine:
        cached = live.package_engines.get(package["ModelPackageArn"])
        if cached is None:
            _, entry = self.control_plane.base_model_for_arn(live.detail["ModelConfig"]["BaseModelArn"])
            cached = engine_module.Engine(entry["path"], package["_lora"]["Rank"], package["_lora"]["Alpha"])
            cached.load_adapter_from_peft(self._adapter_of(package))
            live.package_engines = {package["ModelPackageArn"]: cached}  # one at a time: memory
        return cached

    def sampling_operation_result(self, request: dict) -> dict:
        return self.operation_result(request)

    # ---- artifacts
    def _save(self, live: LiveSession, operation: Operation) -> dict:
        checkpoint = operation.kind == "saveState"
        base = live.detail["OutputConfig"]["S3Location"]["Path"].rstrip("/")
        folder = "checkpoints" if checkpoint else "weights"
        prefix = f"{base}/{folder}/{uuid.uuid4().hex[:8]}"  # the SDK's default path already names the session
        bucket, key = split_s3(prefix)
        self._ensure_bucket(bucket)
        # Under the engine's lock: a sampling operation on saved weights swaps them into this model
        # while it samples, and a save then would write those instead of the weights being trained
        # (an overlapped RL loop saves while its next batch samples).
        with live.engine.lock, tempfile.TemporaryDirectory() as tmp, phase("save_adapter"):
            live.engine.model.save_pretrained(tmp)  # a PEFT adapter folder: PeftModel.from_pretrained loads it
            if operation.config.get("mergeWeights"):
                # hf_merged/: the merged model and its tokenizer as save_pretrained writes them, the folder
                # an inference container (TGI, LMI) serves from /opt/ml/model as it is.
                live.engine.merged_model().save_pretrained(Path(tmp) / "hf_merged")
                live.engine.tokenizer.save_pretrained(Path(tmp) / "hf_merged")
            files = {str(p.relative_to(tmp)): p.read_bytes() for p in Path(tmp).rglob("*") if p.is_file()}
            if checkpoint:
                files["optimizer.pt"] = live.engine.state_bytes(with_optimizer=True)
        with phase("save_s3", bytes=sum(len(data) for data in files.values())):
            for name, data in files.items():
                self.aws.s3.put_object(Bucket=bucket, Key=f"{key}/{name}", Body=data)
            package = self.control_plane.register_package(
                live, prefix + "/", checkpoint, operation.config.get("description", "")
            )
        if not checkpoint:  # a loop samples what it just saved: its tensors from these bytes, not read back
            self._remember_adapter(package["ModelPackageArn"], files["adapter_model.safetensors"])
        return {"modelPackageArn": package["ModelPackageArn"]}

    def _ensure_bucket(self, bucket: str) -> None:
        try:
            self.aws.s3.head_bucket(Bucket=bucket)
        except Exception:  # noqa: BLE001 - absent: SageMaker writes to an existing bucket; local mode makes it
            self.aws.create_bucket(bucket)

    def _read(self, package: dict, name: str) -> bytes:
        uri = package["InferenceSpecification"]["Containers"][0]["ModelDataSource"]["S3DataSource"]["S3Uri"]
        bucket, key = split_s3(uri.rstrip("/"))
        try:
            return self.aws.s3.get_object(Bucket=bucket, Key=f"{key}/{name}")["Body"].read()
        except Exception:  # noqa: BLE001
            raise ServiceError(
                "ValidationException",
                f"Model package {package['ModelPackageArn']} has no {name} under {uri}: its artifacts were deleted.",
            ) from None

    def _remember_adapter(self, arn: str, data: bytes) -> None:
        """The adapter a package holds, kept for its sampling operations: one package's at a time."""
        from safetensors.torch import load

        with self.lock, phase("load_adapter", bytes=len(data)):
            self._adapters = {arn: load(data)}

    def _adapter_of(self, package: dict) -> dict:
        arn = package["ModelPackageArn"]
        with self.lock:
            if arn not in self._adapters:  # a loop samples the same saved weights many times
                self._remember_adapter(arn, self._read(package, "adapter_model.safetensors"))
            return self._adapters[arn]

    def _load_package(self, live: LiveSession, package: dict, with_optimizer: bool) -> None:
        if package["_lora"]["Rank"] != live.detail["LoraConfig"]["Rank"]:
            raise ServiceError(
                "ValidationException",
                f"Model package {package['ModelPackageArn']} was saved with LoRA rank "
                f"{package['_lora']['Rank']}; this session has rank {live.detail['LoraConfig']['Rank']}. "
                "Create the session with the checkpoint's rank.",
            )
        is_checkpoint = package["InferenceSpecification"]["Containers"][0]["IsCheckpoint"]
        if with_optimizer and not is_checkpoint:
            raise ServiceError(
                "ValidationException",
                f"Model package {package['ModelPackageArn']} holds weights only (saveWeights): load it "
                "without the optimizer, or give a saveState checkpoint.",
            )
        engine = live.engine
        with engine.lock:
            engine.load_adapter_from_peft(self._adapter_of(package))
            engine.reset_optimizer()
            if with_optimizer:
                engine.load_optimizer_bytes(self._read(package, "optimizer.pt"))


def check_token_ids(tokens, vocabulary: int, where: str) -> None:
    for position, token in enumerate(tokens):
        if not 0 <= token < vocabulary:
            raise engine_module.InputError(
                f"{where} has token id {token} at position {position}, outside the model's vocabulary "
                f"[0, {vocabulary}): give ids the session's tokenizer produced (get_tokenizer())."
            )


def check_datums(live: LiveSession, datums: list, loss_fn: str) -> None:
    """What the engine would otherwise fail on mid-operation, refused at submit: token ids outside
    the vocabulary, a datum longer than the context, inputs that are not finite in their dtype."""
    try:
        parsed = engine_module.parse_datums(datums, loss_fn)
    except (RuntimeError, OverflowError, TypeError, ValueError) as error:
        if isinstance(error, engine_module.InputError):
            raise
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise engine_module.InputError(
            f"datumList holds data that cannot be read as tensors ({reason}): give lists of numbers that "
            "fit their dtype, and shapes of non-negative sizes."
        ) from None
    for index, (tokens, inputs) in enumerate(parsed):
        where = f"datumList[{index}]"
        check_token_ids(tokens, live.vocabulary, f"{where}.modelInput")
        if len(tokens) > live.context:
            raise engine_module.InputError(
                f"{where}.modelInput has {len(tokens)} tokens, more than the model's context of {live.context}: "
                f"truncate or split the datum to at most {live.context} tokens."
            )
        for name, tensor in inputs.items():
            dtype = datums[index]["lossFnInputs"][name]["dtype"]
            if name == "target_tokens":
                if tensor.is_floating_point() and not (tensor == tensor.round()).all():
                    raise engine_module.InputError(
                        f"{where}.lossFnInputs['target_tokens'] holds fractions: token ids are whole numbers "
                        "(dtype int64)."
                    )
                check_token_ids(tensor.tolist(), live.vocabulary, f"{where}.lossFnInputs['target_tokens']")
            elif not tensor.isfinite().all():
                raise engine_module.InputError(
                    f"{where}.lossFnInputs['{name}'] holds values that are not finite in {dtype} (too large "
                    "for it, or NaN): send them as float32, or bring them into the dtype's range."
                )


def _union(config: dict, where: str) -> tuple[str, dict]:
    """The one member set in a union shape (botocore checks the shape, not that exactly one is set)."""
    members = [k for k, v in config.items() if v is not None]
    if len(members) != 1:
        raise ServiceError(
            "ValidationException",
            f"{where} must set exactly one operation, got {len(members)} ({', '.join(members) or 'none'}).",
        )
    return members[0], config[members[0]]
