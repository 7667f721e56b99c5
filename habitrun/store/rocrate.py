"""A run as a Workflow Run RO-Crate: the recipe as the workflow, an action per stage (and subject), files with digests.

The crate follows the Workflow Run RO-Crate profiles 0.5 (Process, Workflow and
Provenance Run Crate; https://w3id.org/ro/wfrun/workflow/0.5), the form
Nextflow's nf-prov and Snakemake's report plugin write:

- the run's resolved recipe (``recipe.yaml``, overrides applied) is the
  ``ComputationalWorkflow`` (mainEntity); each stage is a tool
  (``SoftwareApplication``, its operator and packages) and a ``HowToStep``;
  each stage's params are ``FormalParameter``s, their values ``PropertyValue``s;
- the run is a ``CreateAction`` (instrument: the recipe), habitrun's part an
  ``OrganizeAction`` (instrument: habitrun with every installed distribution
  as ``softwareRequirements``), each stage a ``ControlAction`` over one
  ``CreateAction`` for the stage and, while the crate stays small, one per
  subject (times, status, error, its input and output files);
- input files (``file://`` URIs; they are not copied) carry the sha256 of
  their content when it is still the content the run read (checked against
  the run's own digest), output files the sha256 of what they hold now (a
  result's work folder is never rewritten); the lock files of the run
  (``environment.json``, ``provenance.json``, ``inputs.tsv``) and
  ``outputs.tsv`` (every output file with its sha256) are copied in.

Size: per-subject actions only while the run has at most
:data:`MAX_SUBJECT_ACTIONS` subject-stage attempts, and one ``File`` entity
per input or output file only while there are at most :data:`MAX_FILE_ENTITIES`;
beyond, the stage actions point at ``inputs.tsv`` / ``outputs.tsv`` instead.
That keeps ``ro-crate-metadata.json`` under about 3 MB for any study.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any

import habitrun
from habitrun.store.checkpoint import CheckpointStore
from habitrun.store.environment import ENVIRONMENT_FILE, INPUTS_FILE, read_environment, read_inputs
from habitrun.store.runs import PROVENANCE_FILE, RunFolder
from habitrun.store.trace import COL

MAX_SUBJECT_ACTIONS = 1000
MAX_FILE_ENTITIES = 2000
OUTPUTS_FILE = "outputs.tsv"
METADATA_FILE = "ro-crate-metadata.json"
RECIPE_ID = "recipe.yaml"
PROFILES = {
    "https://w3id.org/ro/wfrun/process/0.5": "Process Run Crate",
    "https://w3id.org/ro/wfrun/workflow/0.5": "Workflow Run Crate",
    "https://w3id.org/ro/wfrun/provenance/0.5": "Provenance Run Crate",
    "https://w3id.org/workflowhub/workflow-ro-crate/1.0": "Workflow RO-Crate",
}
CONTEXT = ["https://w3id.org/ro/crate/1.1/context", "https://w3id.org/ro/terms/workflow-run/context"]
_STATUS = {"done": "http://schema.org/CompletedActionStatus", "failed": "http://schema.org/FailedActionStatus"}


@dataclass
class CrateSummary:
    """What an export wrote: the crate's folder and how much it lists."""

    folder: Path
    stages: int
    subject_actions: int
    files: int  # File entities listed
    per_subject: bool
    per_file: bool
    notes: list[str] = field(default_factory=list)


def _ref(identifier: str) -> dict[str, str]:
    return {"@id": identifier}


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="seconds")


def _value(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) else json.dumps(value, default=str)


def _paths_in(value: Any) -> Iterator[str]:
    """Absolute paths of existing files named by a stored result (through dicts, lists, tuples)."""
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _paths_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _paths_in(item)
    elif isinstance(value, (str, PurePath)):
        text = str(value)
        if os.path.isabs(text) and len(text) < 4096 and os.path.isfile(text):
            yield text


def _digests(path: str) -> tuple[str, str, int] | None:
    """(sha256, blake2b-128, size) of a file's bytes, read once; None when it cannot be read."""
    sha, blake = hashlib.sha256(), hashlib.blake2b(digest_size=16)
    size = 0
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                sha.update(block)
                blake.update(block)
                size += len(block)
    except OSError:
        return None
    return sha.hexdigest(), blake.hexdigest(), size


class _Graph:
    """The crate's entities by id, in the order first added."""

    def __init__(self) -> None:
        self.entities: dict[str, dict[str, Any]] = {}

    def add(self, entity_id: str, kind: str | list[str], /, **props: Any) -> dict[str, Any]:
        entity = self.entities.setdefault(entity_id, {"@id": entity_id, "@type": kind})
        entity.update({k: v for k, v in props.items() if v is not None})
        return entity


def export_crate(dest: Path, *, run: RunFolder, recipe: Any, store: CheckpointStore, study_root: Path,
                 max_subject_actions: int = MAX_SUBJECT_ACTIONS,
                 max_files: int = MAX_FILE_ENTITIES) -> CrateSummary:
    """Write ``run`` as a Workflow Run RO-Crate into the folder ``dest`` (see the module docstring).

    ``recipe``: the run's resolved recipe model; ``store``: the study's store, read only.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    prov = run.read_provenance()
    env = read_environment(run.path) or {}
    inputs = read_inputs(run.path) or {}
    rows = store.trace(run_id=run.run_id)
    last: dict[tuple[str, str], tuple] = {}
    for row in rows:
        last[(row[COL["stage"]], row[COL["subject"]])] = row  # the final attempt of each
    done_keys = [row[COL["key"]] for row in last.values() if row[COL["outcome"]] == "done" and row[COL["key"]]]
    results = store.results(done_keys) if done_keys else {}
    per_subject = len(last) <= max_subject_actions

    outputs: list[tuple[str, str, str]] = []  # (stage, subject, path)
    for (stage, subject), row in last.items():
        result = results.get(row[COL["key"]])
        outputs.extend((stage, subject, p) for p in dict.fromkeys(_paths_in(result)))
    per_file = len(inputs) + len(outputs) <= max_files

    graph = _Graph()
    notes: list[str] = []
    _copy_lock_files(run, dest)
    output_digests = _write_outputs(dest, outputs)
    root = str(study_root)

    files_listed = 0

    def input_file(key: tuple[str, str, str]) -> str:
        nonlocal files_listed
        written = key[2]
        full = written if os.path.isabs(written) else os.path.join(root, written)
        uri = Path(full).as_uri()
        if uri not in graph.entities:
            digests = _digests(full)
            run_digest = inputs[key]
            props: dict[str, Any] = {"name": written, "identifier": f"blake2b-128:{run_digest}"}
            if digests is not None and digests[1] == run_digest:
                props.update(sha256=digests[0], contentSize=str(digests[2]))
            else:
                props["description"] = "changed or gone since the run: no sha256 of the content it read"
            graph.add(uri, "File", **props)
            files_listed += 1
        return uri

    def output_file(path: str) -> str:
        nonlocal files_listed
        uri = Path(path).as_uri()
        if uri not in graph.entities:
            sha, size = output_digests.get(path, (None, None))
            graph.add(uri, "File", name=os.path.relpath(path, root) if path.startswith(root) else path,
                      sha256=sha, contentSize=None if size is None else str(size))
            files_listed += 1
        return uri

    # The metadata descriptor and the root.
    graph.add(METADATA_FILE, "CreativeWork", about=_ref("./"),
              conformsTo=[_ref("https://w3id.org/ro/crate/1.1"),
                          _ref("https://w3id.org/workflowhub/workflow-ro-crate/1.0")])
    run_action = f"#run-{run.run_id}"
    name = getattr(recipe, "name", None) or "study"
    graph.add("./", "Dataset", name=f"{name}: run {run.run_id}",
              description=f"habitrun run {run.run_id} of the study {name}, exported as a Workflow Run RO-Crate.",
              datePublished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
              conformsTo=[_ref(p) for p in PROFILES], mainEntity=_ref(RECIPE_ID), mentions=[_ref(run_action)])
    for iri, label in PROFILES.items():
        graph.add(iri, "CreativeWork", name=label, version=iri.rsplit("/", 1)[1])

    # The workflow: the recipe, its stages as tools and steps, their params.
    stages = list(recipe.ordered_stages())
    graph.add("#habitrun-recipe", "ComputerLanguage", name="habitrun recipe", alternateName="habitrun",
              version=str(getattr(recipe, "habitrun", 1)), url=_ref("https://pypi.org/project/habitrun/"))
    workflow = graph.add(RECIPE_ID, ["File", "SoftwareSourceCode", "ComputationalWorkflow", "HowTo"], name=name,
                         description=getattr(recipe, "description", None),
                         programmingLanguage=_ref("#habitrun-recipe"),
                         hasPart=[], step=[], input=[_ref("#param-subjects")], output=[])
    graph.add("#param-subjects", "FormalParameter", additionalType="File", name="subjects",
              description="the subjects' input files (inputs.tsv lists each with the digest the run read)")
    env_stages = env.get("stages") or {}
    for position, stage in enumerate(stages):
        tool, step = f"#stage-{stage.name}", f"#step-{stage.name}"
        packages = (env_stages.get(stage.name) or {}).get("packages") or {}
        target = stage.operator or stage.entrypoint or " ".join(stage.command or ())
        graph.add(tool, "SoftwareApplication", name=stage.name, description=f"{stage.kind} stage: {target}",
                  softwareRequirements=[_ref(_dist(graph, n, v)) for n, v in sorted(packages.items())] or None,
                  input=[], output=[_ref(f"#output-{stage.name}")])
        graph.add(f"#output-{stage.name}", "FormalParameter", additionalType="File", name=f"{stage.name}/output")
        workflow["output"].append(_ref(f"#output-{stage.name}"))
        for pname, pvalue in sorted((stage.params or {}).items()):
            pid = f"#param-{stage.name}/{pname}"
            graph.add(pid, "FormalParameter", name=f"{stage.name}/{pname}", additionalType=_type(pvalue))
            graph.entities[tool]["input"].append(_ref(pid))
            workflow["input"].append(_ref(pid))
            graph.add(f"#pv-{stage.name}/{pname}", "PropertyValue", name=f"{stage.name}/{pname}",
                      value=_value(pvalue), exampleOfWork=_ref(pid))
        workflow["hasPart"].append(_ref(tool))
        workflow["step"].append(_ref(step))
        graph.add(step, "HowToStep", name=stage.name, position=str(position), workExample=_ref(tool))

    # The engine and the environment.
    engine = graph.add("#habitrun", "SoftwareApplication", name=f"habitrun {env.get('habitrun', habitrun.__version__)}",
                       version=env.get("habitrun", habitrun.__version__), url=_ref("https://pypi.org/project/habitrun/"))
    dists = env.get("distributions") or {}
    engine["softwareRequirements"] = [_ref(_dist(graph, n, v)) for n, v in dists.items()] or None
    python = env.get("python") or {}
    if python:
        graph.add("#python", "SoftwareApplication", name=f"{python.get('implementation')} {python.get('version')}",
                  version=python.get("version"))
        engine.setdefault("softwareRequirements", []).append(_ref("#python"))

    # The run, its stages and subjects.
    status = prov.get("outcome")
    all_inputs = [input_file(k) for k in inputs] if per_file else [_ref(INPUTS_FILE)["@id"]]
    all_outputs = [output_file(p) for _, _, p in outputs] if per_file else [OUTPUTS_FILE]
    graph.add(run_action, "CreateAction", name=f"Run {run.run_id} of {name}", instrument=_ref(RECIPE_ID),
              startTime=prov.get("started_at"), endTime=prov.get("ended_at"),
              actionStatus=_ref(_STATUS["done" if status == "succeeded" else "failed"]),
              description=f"outcome: {status}; overrides: {' '.join(prov.get('overrides') or []) or 'none'}",
              object=[_ref(i) for i in dict.fromkeys(all_inputs)]
              + [_ref(f"#pv-{s.name}/{p}") for s in stages for p in sorted(s.params or {})],
              result=[_ref(o) for o in dict.fromkeys(all_outputs)])
    controls = []
    subject_actions = 0
    for stage in stages:
        mine = {subject: row for (st, subject), row in last.items() if st == stage.name}
        stage_outputs = [p for st, _, p in outputs if st == stage.name]
        action = f"#run-{run.run_id}/{stage.name}"
        starts = [r[COL["started_at"]] for r in mine.values() if r[COL["started_at"]] is not None]
        ends = [r[COL["ended_at"]] for r in mine.values() if r[COL["ended_at"]] is not None]
        failed = sum(1 for r in mine.values() if r[COL["outcome"]] != "done")
        params = [_ref(f"#pv-{stage.name}/{p}") for p in sorted(stage.params or {})]
        columns = set((env_stages.get(stage.name) or {}).get("file_columns") or ())
        stage_inputs = [k for k in inputs if (k[0] == "*" and k[1] == f"{stage.name}.inputs")
                        or (k[0] != "*" and k[1] in columns)]
        objects = ([_ref(input_file(k)) for k in stage_inputs] if per_file else [_ref(INPUTS_FILE)]) + params
        graph.add(action, "CreateAction", name=f"Run of stage {stage.name} ({len(mine)} subject(s), {failed} failed)",
                  instrument=_ref(f"#stage-{stage.name}"), startTime=_iso(min(starts, default=None)),
                  endTime=_iso(max(ends, default=None)),
                  actionStatus=_ref(_STATUS["failed" if failed else "done"]) if mine else None,
                  object=objects,
                  result=[_ref(output_file(p)) for p in stage_outputs] if per_file else [_ref(OUTPUTS_FILE)])
        acts = [_ref(action)]
        if per_subject:
            by_subject: dict[str, list[tuple[str, str, str]]] = {}
            for k in stage_inputs:
                by_subject.setdefault(k[0], []).append(k)
            made: dict[str, list[str]] = {}
            for st, s, p in outputs:
                if st == stage.name:
                    made.setdefault(s, []).append(p)
            for subject, row in sorted(mine.items()):
                sid = f"{action}/{subject}"
                own_inputs = by_subject.get(subject, [])
                graph.add(sid, "CreateAction", name=f"{stage.name} of {subject}", instrument=_ref(f"#stage-{stage.name}"),
                          startTime=_iso(row[COL["started_at"]]), endTime=_iso(row[COL["ended_at"]]),
                          actionStatus=_ref(_STATUS["done" if row[COL["outcome"]] == "done" else "failed"]),
                          error=row[COL["error"]] or None,
                          object=([_ref(input_file(k)) for k in own_inputs] if per_file else []) + params,
                          result=[_ref(output_file(p)) for p in made.get(subject, [])] if per_file else None)
                acts.append(_ref(sid))
                subject_actions += 1
        control = f"#control-{stage.name}"
        graph.add(control, "ControlAction", name=f"orchestrate {stage.name}", instrument=_ref(f"#step-{stage.name}"),
                  object=acts)
        controls.append(_ref(control))
    graph.add(f"#habitrun-run-{run.run_id}", "OrganizeAction", name=f"Run of habitrun {engine['version']}",
              instrument=_ref("#habitrun"), result=_ref(run_action), object=controls,
              startTime=prov.get("started_at"), endTime=prov.get("ended_at"))

    # The files copied in, and the data entities the root holds.
    for name_, what in ((ENVIRONMENT_FILE, "the run's environment lock: Python, platform, every installed "
                                          "distribution, the repository's commit, each stage's code"),
                        (PROVENANCE_FILE, "the run's provenance record"),
                        (INPUTS_FILE, "every input file the run read, with the digest it read (blake2b-128)"),
                        (OUTPUTS_FILE, "every output file of the run, with its sha256 and size")):
        if (dest / name_).is_file():
            graph.add(name_, "File", name=name_, description=what, encodingFormat="application/json"
                      if name_.endswith(".json") else "text/tab-separated-values", about=_ref(run_action))
    (dest / RECIPE_ID).write_bytes(run.recipe_file.read_bytes())
    graph.entities["./"]["hasPart"] = [_ref(i) for i, e in graph.entities.items()
                                       if i != METADATA_FILE and "File" in _types(e)]
    if not per_subject:
        notes.append(f"{len(last)} subject-stage attempts: more than {max_subject_actions}, so one action per "
                     "stage only")
    if not per_file:
        notes.append(f"{len(inputs) + len(outputs)} files: more than {max_files}, so they are listed in "
                     f"{INPUTS_FILE} and {OUTPUTS_FILE} only")
    document = {"@context": CONTEXT, "@graph": list(graph.entities.values())}
    tmp = dest / f".{METADATA_FILE}.tmp"
    tmp.write_text(json.dumps(document, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, dest / METADATA_FILE)
    return CrateSummary(dest, len(stages), subject_actions, files_listed, per_subject, per_file, notes)


def _types(entity: Mapping[str, Any]) -> list[Any]:  # [None] for an entity without @type
    kind = entity.get("@type")
    return kind if isinstance(kind, list) else [kind]


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "Boolean"
    if isinstance(value, int):
        return "Integer"
    if isinstance(value, float):
        return "Float"
    if isinstance(value, str):
        return "Text"
    return "Collection" if isinstance(value, (list, tuple)) else "DataType"


def _dist(graph: _Graph, name: str, version: str) -> str:
    identifier = f"#dist-{name}-{version}"
    graph.add(identifier, "SoftwareApplication", name=name, version=version)
    return identifier


def _copy_lock_files(run: RunFolder, dest: Path) -> None:
    for name in (ENVIRONMENT_FILE, PROVENANCE_FILE, INPUTS_FILE):
        if (run.path / name).is_file():
            shutil.copyfile(run.path / name, dest / name)


def _write_outputs(dest: Path, outputs: list[tuple[str, str, str]]) -> dict[str, tuple[str, int]]:
    """``outputs.tsv`` (stage, subject, path, sha256, bytes) in the crate; path -> (sha256, size)."""
    digests: dict[str, tuple[str, int]] = {}
    lines = ["stage\tsubject\tpath\tsha256\tbytes\n"]
    for stage, subject, path in outputs:
        if path not in digests:
            found = _digests(path)
            if found is None:
                continue
            digests[path] = (found[0], found[2])
        sha, size = digests[path]
        lines.append(f"{stage}\t{subject}\t{path}\t{sha}\t{size}\n")
    (dest / OUTPUTS_FILE).write_text("".join(lines), encoding="utf-8", errors="surrogateescape")
    return digests
