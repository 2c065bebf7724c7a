"""Property-based fuzzing of the endpoint with hypothesis: requests generated from botocore's own
service shapes (``sagemaker`` and ``sagemakertrainingsessionruntime``), valid and then mutated (a
member dropped, replaced by NaN, a huge number, text, null, a list..., an unknown member added), sent
as raw signed HTTP so that what botocore would refuse to build reaches the endpoint too.

For every request to the control plane, the runtime and the training-job API:
  * the answer is 2xx or 4xx, never 5xx, and a 4xx is in the protocol's error shape with a message
    free of tracebacks and server paths;
  * a refused request leaves the state as it was (sessions, packages and jobs on disk);
  * the endpoint is still alive and answering afterwards.

A few examples per operation (120 in all) run with the suite, derandomized so that every machine runs
the same ones; ``-m slow`` runs 300 per operation, freshly drawn.
"""

from __future__ import annotations

import json
import math
import re
from base64 import b64encode
from functools import cache
from pathlib import Path
from urllib.parse import quote

import botocore.session
import psutil
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from local_mode.tiny_model import tiny_model_dir

from .conftest import ROLE, TINY_ARN, control_plane_request, send

# Examples per operation: with the suite (the same ones on every machine), and under -m slow (fresh ones).
CI_EXAMPLES = {"control plane": 5, "job API": 5, "runtime": 10}
SLOW_EXAMPLES = 300
VOLATILE = ("LastModifiedTime", "BillableTokenUsage")  # moved by operations accepted earlier, still running


@cache
def model(name: str):
    return botocore.session.get_session().get_service_model(name)


def vocabulary() -> int:
    return json.loads((Path(tiny_model_dir()) / "config.json").read_text())["vocab_size"]


# --------------------------------------------------------------------------- requests from shapes

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.floats(-4, 4), st.text(max_size=6))
DOCUMENTS = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
)


@st.composite
def datums(draw):
    """A datum whose inputs fit its tokens, with every loss's inputs: valid for any lossFnName."""
    length = draw(st.integers(1, 6))
    tokens = st.lists(st.integers(0, vocabulary() - 1), min_size=length, max_size=length)
    numbers = st.lists(st.floats(-2, 2), min_size=length, max_size=length)
    return {
        "modelInput": {"chunks": [{"tokens": draw(tokens), "type": "encoded_text"}]},
        "lossFnInputs": {
            "target_tokens": {"data": draw(tokens), "dtype": "int64"},
            "weights": {"data": draw(numbers), "dtype": "float32", "shape": [length]},
            "logprobs": {"data": [-abs(x) for x in draw(numbers)], "dtype": "float32"},
            "advantages": {"data": draw(numbers), "dtype": "float32"},
        },
    }


SPECIAL = {"Datum": datums()}


def from_shape(shape, depth: int = 0):
    """Values botocore's shape allows (members, types, enums, patterns, ranges), small."""
    if shape.name in SPECIAL:
        return SPECIAL[shape.name]
    meta, kind = shape.metadata, shape.type_name
    if kind == "structure":
        if getattr(shape, "is_document_type", False):
            return DOCUMENTS
        members = shape.members
        if meta.get("union"):
            return st.one_of([st.fixed_dictionaries({n: from_shape(m, depth + 1)}) for n, m in members.items()])
        required = {n: from_shape(members[n], depth + 1) for n in shape.required_members}
        optional = {} if depth > 4 else {n: from_shape(m, depth + 1) for n, m in members.items() if n not in required}
        return st.fixed_dictionaries(required, optional=optional)
    if kind == "list":
        low = meta.get("min", 0)
        return st.lists(from_shape(shape.member, depth + 1), min_size=low, max_size=max(low, 2))
    if kind == "map":
        return st.dictionaries(from_shape(shape.key, depth + 1), from_shape(shape.value, depth + 1), max_size=2)
    if kind == "string":
        if shape.enum:
            return st.sampled_from(shape.enum)
        low, high = meta.get("min", 0), min(meta.get("max", 24), 24)
        pattern = meta.get("pattern")
        if pattern:
            try:
                re.compile(pattern)
                return st.from_regex(pattern, fullmatch=True).filter(lambda s: low <= len(s) <= meta.get("max", 1e9))
            except re.error:  # a Java-only construct
                pass
        return st.text(min_size=low, max_size=max(low, high))
    if kind in ("integer", "long"):
        low = int(meta.get("min", 0))
        return st.integers(low, min(int(meta.get("max", low + 4)), low + 4))
    if kind in ("double", "float"):
        low = float(meta.get("min", 0))
        return st.floats(low, float(meta.get("max", low + 1)))
    if kind == "boolean":
        return st.booleans()
    if kind == "timestamp":
        return st.floats(0, 2e9) | st.sampled_from(["2024-01-01T00:00:00Z", "2030-05-06T07:08:09.5+02:00"])
    if kind == "blob":
        return st.binary(max_size=8).map(lambda b: b64encode(b).decode())
    raise AssertionError(f"no strategy for shape {shape.name} of type {kind}")


WILD = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1, 0, 2**31, 2**63, 2**80, -(2**70), True, None, ""]),
    st.text(max_size=12),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.floats(),
)


def paths(value, at=()):
    yield at
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*at, index))


def replaced(value, path, new):
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


def dropped(value, path):
    if len(path) == 1:
        copy = dict(value) if isinstance(value, dict) else list(value)
        del copy[path[0]]
        return copy
    return replaced(value, path[:1], dropped(value[path[0]], path[1:]))


@st.composite
def requests(draw, service: str, operations: tuple[str, ...], fixed: dict | None = None):
    """(operation, request): valid for its shape, then 0-3 mutations."""
    operation = draw(st.sampled_from(operations))
    request = draw(from_shape(model(service).operation_model(operation).input_shape))
    request.update(fixed or {})
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(list(paths(request))[1:] or [()]))
        how = draw(st.sampled_from(["replace", "drop", "add"]))
        if not where:
            break
        if how == "replace":
            request = replaced(request, where, draw(WILD))
        elif how == "drop":
            request = dropped(request, where)
        else:
            parent = where[:-1]
            node = request
            for key in parent:
                node = node[key]
            if isinstance(node, dict):  # an unknown member
                request = replaced(request, parent, {**node, draw(st.text(min_size=1, max_size=8)): draw(WILD)})
    return operation, request


# --------------------------------------------------------------------------- sending and checking


def runtime_request(endpoint, operation: str, request: dict):
    http = model("sagemakertrainingsessionruntime").operation_model(operation)
    members = http.input_shape.members
    uri = http.http["requestUri"]
    body = dict(request)
    for name, member in members.items():
        if member.serialization.get("location") == "uri":
            value = body.pop(name, "")
            uri = uri.replace("{" + name + "}", quote(str(value), safe="") or "x")
    payload = json.dumps(body).encode() if http.http["method"] != "GET" else b""
    return send(endpoint, http.http["method"], uri, payload, {"Content-Type": "application/json"})


def state(endpoint) -> dict:
    """What a refused request must not change: sessions, model packages and training jobs on disk."""
    seen = {}
    for folder in (
        "training-sessions/sessions",
        "training-sessions/model-package-groups",
        "training-sessions/model-packages",
        "jobs",
    ):
        for path in sorted((endpoint.root / folder).rglob("*.json")):
            document = json.loads(path.read_text())
            seen[str(path.relative_to(endpoint.root))] = {k: v for k, v in document.items() if k not in VOLATILE}
    return seen


def check(endpoint, operation: str, answer, runtime: bool) -> None:
    status, headers, body = answer
    event(f"{operation}: {status}")  # pytest --hypothesis-show-statistics shows what was reached
    assert status < 500, (status, body[:2000])
    if status >= 400:
        error = json.loads(body)
        code = headers.get("x-amzn-ErrorType") if runtime else error["__type"]
        assert code and error["message"], (status, error)
        message = error["message"]
        assert "Traceback" not in message and 'File "' not in message and ".py" not in message, message
        assert str(endpoint.root) not in message, message


def alive(endpoint) -> None:
    assert psutil.pid_exists(endpoint.pid)
    body = json.dumps({"HubName": "SageMakerPublicHub", "HubContentType": "Model"}).encode()
    status, _, answer = control_plane_request(endpoint, "ListHubContents", body)
    assert status == 200, answer


def fuzz(examples: int, strategy, case) -> None:
    """Run ``case(operation, request)`` on ``examples`` generated requests."""
    ci = examples < SLOW_EXAMPLES
    configured = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=ci,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    configured(given(strategy)(lambda drawn: case(*drawn)))()


# --------------------------------------------------------------------------- targets

SESSION_OPERATIONS = (
    "CreateTrainingSession",
    "DescribeTrainingSession",
    "ListTrainingSessions",
    "StopTrainingSession",
    "DeleteTrainingSession",
    "ListHubContents",
    "DescribeHubContent",
    "CreateModelPackageGroup",
    "DescribeModelPackageGroup",
    "ListModelPackages",
    "DescribeModelPackage",
    "DeleteModelPackage",
)
JOB_OPERATIONS = ("CreateTrainingJob", "DescribeTrainingJob", "ListTrainingJobs", "StopTrainingJob")
RUNTIME_OPERATIONS = (
    "ExecuteTrainingOperation",
    "ExecuteSamplingOperation",
    "GetTrainingOperationResult",
    "GetSamplingOperationResult",
)


@pytest.fixture(scope="module")
def running(clients):
    """The session the runtime's requests go to, Running, stopped afterwards (which ends what it queued)."""
    control, _ = clients
    name = "fuzz-target"
    control.create_training_session(
        TrainingSessionName=name,
        LoraConfig={"Rank": 4, "Alpha": 8},
        RoleArn=ROLE,
        ModelConfig={"BaseModelArn": TINY_ARN},
        OutputConfig={"S3Location": {"Path": "s3://session-tests/fuzz"}},
    )
    yield name
    control.stop_training_session(TrainingSessionName=name)


def control_plane_case(endpoint):
    def case(operation, request):
        before = state(endpoint)
        answer = control_plane_request(endpoint, operation, json.dumps(request).encode())
        check(endpoint, operation, answer, runtime=False)
        if answer[0] >= 400:
            assert state(endpoint) == before, (operation, request, answer[2][:500])
        alive(endpoint)

    return case


def job_api_case(endpoint):
    def case(operation, request):
        if operation == "CreateTrainingJob" and isinstance(request, dict):
            # Refused at the end of validation, so that no generated job runs on this machine.
            request = {**request, "CheckpointConfig": {"LocalPath": "/not-under-opt-ml"}}
        before = state(endpoint)
        answer = control_plane_request(endpoint, operation, json.dumps(request).encode())
        check(endpoint, operation, answer, runtime=False)
        if operation == "CreateTrainingJob":
            assert answer[0] >= 400, "a generated training job was accepted"
        if answer[0] >= 400:
            assert state(endpoint) == before, (operation, request, answer[2][:500])
        alive(endpoint)

    return case


def runtime_case(endpoint):
    def case(operation, request):
        before = state(endpoint)
        answer = runtime_request(endpoint, operation, request)
        check(endpoint, operation, answer, runtime=True)
        if answer[0] >= 400:
            assert state(endpoint) == before, (operation, request, answer[2][:500])
        alive(endpoint)

    return case


@pytest.mark.parametrize("operation", SESSION_OPERATIONS)
def test_control_plane_fuzz(endpoint, operation):
    fuzz(CI_EXAMPLES["control plane"], requests("sagemaker", (operation,)), control_plane_case(endpoint))


@pytest.mark.parametrize("operation", JOB_OPERATIONS)
def test_job_api_fuzz(endpoint, operation):
    fuzz(CI_EXAMPLES["job API"], requests("sagemaker", (operation,)), job_api_case(endpoint))


@pytest.mark.parametrize("operation", RUNTIME_OPERATIONS)
def test_runtime_fuzz(endpoint, running, operation):
    strategy = requests("sagemakertrainingsessionruntime", (operation,), {"trainingSessionName": running})
    fuzz(CI_EXAMPLES["runtime"], strategy, runtime_case(endpoint))


@pytest.mark.slow
@pytest.mark.parametrize("operation", SESSION_OPERATIONS + JOB_OPERATIONS + RUNTIME_OPERATIONS)
def test_fuzz_long(endpoint, running, operation):
    if operation in RUNTIME_OPERATIONS:
        strategy = requests("sagemakertrainingsessionruntime", (operation,), {"trainingSessionName": running})
        case = runtime_case(endpoint)
    else:
        strategy = requests("sagemaker", (operation,))
        case = (job_api_case if operation in JOB_OPERATIONS else control_plane_case)(endpoint)
    fuzz(SLOW_EXAMPLES, strategy, case)
