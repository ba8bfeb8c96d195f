"""scripts/k8s/: the Kubeflow TrainJob (Trainer v2) and PyTorchJob (Training Operator v1) manifests.

No Kubernetes runs here. Each document is validated against its CRD's OpenAPI schema
(tests/cluster/k8s_schemas/, from the kubeflow repositories) the way the API server validates with
strict field validation: unknown fields are errors, so a misspelt key fails here instead of being
dropped silently on a cluster. Then the promises of docs/clusters.md: torchrun from the PET_*
variables, a valid train.py command (Hydra config composition) that resumes from a run directory on
the persistent volume, exit 75 and restarts handled by the restart/failure policy, shared memory,
data read-only.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).with_name("k8s_schemas")
TRAINJOB = REPO / "scripts" / "k8s" / "trainjob.yaml"
PYTORCHJOB = REPO / "scripts" / "k8s" / "pytorchjob.yaml"
PET_FLAGS = {"--nnodes": "PET_NNODES", "--nproc_per_node": "PET_NPROC_PER_NODE",
             "--node_rank": "PET_NODE_RANK", "--master_addr": "PET_MASTER_ADDR",
             "--master_port": "PET_MASTER_PORT"}
PREEMPTED_EXIT_CODE = 75  # src/engine: a run stopped by a signal after writing its checkpoint


def _closed(schema: object) -> object:
    """`schema` with unknown object fields forbidden, as the API server's strict field validation does."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> closed JSON schema, for every schema file kept under k8s_schemas/."""
    found = {}
    for path in sorted(SCHEMAS.glob("*.json")):
        schema = json.loads(path.read_text())
        found[(schema["x-synctrain-apiVersion"], schema["x-synctrain-kind"])] = _closed(schema)
    return found


SCHEMA_BY_KIND = _schemas()


def _errors(document: dict) -> list[str]:
    """Schema violations of one manifest document (an unknown apiVersion/kind is one too)."""
    key = (document.get("apiVersion"), document.get("kind"))
    if key not in SCHEMA_BY_KIND:
        return [f"no schema for {key}; kept: {sorted(SCHEMA_BY_KIND)}"]
    validator = jsonschema.Draft4Validator(SCHEMA_BY_KIND[key])
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator.iter_errors(document)]


def _documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _by_kind(path: Path, kind: str) -> dict:
    matches = [d for d in _documents(path) if d["kind"] == kind]
    assert len(matches) == 1, f"{path.name}: expected one {kind}, found {len(matches)}"
    return matches[0]


def _trainjob_pod(runtime: dict) -> dict:
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["node"], "the torch runtime's replicated job is named 'node'"
    return jobs[0]["template"]["spec"]["template"]["spec"]


def _launches() -> dict[str, tuple[list[str], list[str]]]:
    """Manifest -> (command, args) of its training container."""
    trainer = _by_kind(TRAINJOB, "TrainJob")["spec"]["trainer"]
    out = {"TrainJob": (trainer["command"], trainer["args"])}
    specs = _by_kind(PYTORCHJOB, "PyTorchJob")["spec"]["pytorchReplicaSpecs"]
    for role, spec in specs.items():
        (container,) = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "pytorch"]
        out[f"PyTorchJob {role}"] = (container["command"], container["args"])
    return out


# --- schemas -----------------------------------------------------------------------------------

def test_schemas_record_their_source() -> None:
    expected = {("trainer.kubeflow.org/v1alpha1", "TrainJob"),
                ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"),
                ("kubeflow.org/v1", "PyTorchJob")}
    assert expected <= set(SCHEMA_BY_KIND)
    for path in SCHEMAS.glob("*.json"):
        comment = json.loads(path.read_text())["$comment"]
        assert re.search(r"https://github\.com/kubeflow/(trainer|training-operator)/blob/[0-9a-f]{40}/", comment), path
    assert "Apache License" in (SCHEMAS / "LICENSE").read_text()


@pytest.mark.parametrize("path", [TRAINJOB, PYTORCHJOB], ids=lambda p: p.name)
def test_manifest_matches_crd_schema(path: Path) -> None:
    documents = _documents(path)
    assert documents, f"{path} has no documents"
    for document in documents:
        errors = _errors(document)
        assert not errors, f"{path.name} {document.get('kind')}:\n  " + "\n  ".join(errors)


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["spec"]["trainer"].update(numNodes="two"), "is not of type 'integer'"),
    (lambda d: d["spec"]["trainer"].update(numProcsPerNode=8), "Additional properties are not allowed"),
    (lambda d: d["spec"].pop("runtimeRef"), "'runtimeRef' is a required property"),
], ids=["wrong-type", "misspelt-field", "missing-required"])
def test_validation_rejects_broken_manifests(mutate, expected: str) -> None:
    # Guards the checks above: a schema that accepts anything would pass them too.
    document = copy.deepcopy(_by_kind(TRAINJOB, "TrainJob"))
    mutate(document)
    assert any(expected in e for e in _errors(document)), _errors(document)


# --- the command -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(_launches()))
def test_torchrun_takes_its_topology_from_pet_variables(name: str) -> None:
    command, args = _launches()[name]
    assert command == ["torchrun"], f"{name}: command {command}"
    script = args.index("train.py")
    flags = dict(a.split("=", 1) for a in args[:script])
    assert flags == {flag: f"$({var})" for flag, var in PET_FLAGS.items()}, (
        f"{name}: torchrun flags {flags}; each should come from the PET_* variable the operator sets")


def _compose_and_validate(overrides: list[str], world_size: int) -> None:
    """Compose conf/train.yaml with `overrides` and run train.py's config checks; raise on a bad one.

    In-process (Hydra's compose API): a subprocess per manifest would import torch and the trainer
    each time. `trainer.dry_run=true` would also build the model; composition and validation are what
    need neither the data nor GPUs.
    """
    from hydra import compose, initialize_config_dir

    from src.config import validate_config

    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        cfg = compose("train", overrides=overrides)
    validate_config(cfg, world_size=world_size)


@pytest.mark.parametrize("name", sorted(_launches()))
def test_training_command_composes_and_resumes(name: str) -> None:
    _, args = _launches()[name]
    overrides = args[args.index("train.py") + 1:]
    assert "trainer.resume=auto" in overrides, f"{name}: restarts must resume (trainer.resume=auto)"
    run_dirs = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    assert run_dirs and run_dirs[0].startswith("/runs/"), (
        f"{name}: the run directory must be fixed and on the runs volume (/runs), got {run_dirs}")
    _compose_and_validate(overrides, world_size=16)  # 2 nodes x 8 processes, as in the manifests


@pytest.mark.parametrize("override", ["trainer.no_such_key=1", "trainer.max_steps=many"])
def test_composition_check_rejects_bad_overrides(override: str) -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises((ConfigCompositionException, ValueError)):
        _compose_and_validate([override], world_size=16)


# --- restarts, volumes, shared memory ----------------------------------------------------------

def test_trainjob_runtime_restarts_and_frees_preemptions() -> None:
    runtime = _by_kind(TRAINJOB, "TrainingRuntime")
    job = _by_kind(TRAINJOB, "TrainJob")
    ref = job["spec"]["runtimeRef"]
    assert (ref["kind"], ref["name"]) == ("TrainingRuntime", runtime["metadata"]["name"])
    assert "torch" in runtime["spec"]["mlPolicy"], "the torch policy is what sets PET_*"
    template = runtime["spec"]["template"]["spec"]
    node_job = template["replicatedJobs"][0]["template"]["spec"]
    rules = node_job["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In",
                                                 "values": [PREEMPTED_EXIT_CODE]}} in rules
    assert node_job["template"]["spec"]["restartPolicy"] == "Never", "podFailurePolicy requires Never"
    policy = template["failurePolicy"]
    assert policy["maxRestarts"] >= 1
    first = policy["rules"][0]
    assert first["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    assert first["onJobFailureReasons"] == ["PodFailurePolicy"]


def test_pytorchjob_restarts_on_any_failure() -> None:
    job = _by_kind(PYTORCHJOB, "PyTorchJob")
    for role, spec in job["spec"]["pytorchReplicaSpecs"].items():
        # ExitCode would treat 75 (< 128) as permanent; OnFailure restarts it and resumes.
        assert spec["restartPolicy"] == "OnFailure", role
    assert job["spec"]["runPolicy"]["backoffLimit"] >= 1


def _pods() -> dict[str, tuple[dict, dict]]:
    """Manifest -> (pod spec, training container) for every pod template."""
    runtime_pod = _trainjob_pod(_by_kind(TRAINJOB, "TrainingRuntime"))
    out = {"TrainingRuntime": (runtime_pod, runtime_pod["containers"][0])}
    for role, spec in _by_kind(PYTORCHJOB, "PyTorchJob")["spec"]["pytorchReplicaSpecs"].items():
        pod = spec["template"]["spec"]
        out[f"PyTorchJob {role}"] = (pod, pod["containers"][0])
    return out


@pytest.mark.parametrize("name", sorted(_pods()))
def test_volumes_shm_and_read_only_data(name: str) -> None:
    pod, container = _pods()[name]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert volumes[mounts["/runs"]["name"]].get("persistentVolumeClaim"), f"{name}: /runs must be a PVC"
    data = mounts["/data"]
    assert data.get("readOnly") is True, f"{name}: data must be mounted read-only"
    assert volumes[data["name"]]["persistentVolumeClaim"].get("readOnly") is True
    shm = volumes[mounts["/dev/shm"]["name"]]
    assert shm.get("emptyDir", {}).get("medium") == "Memory", f"{name}: /dev/shm must be a memory emptyDir"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["terminationGracePeriodSeconds"] >= 60, f"{name}: too little time to write last.pt"
