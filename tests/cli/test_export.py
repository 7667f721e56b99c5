"""`habitrun export --ro-crate` through the real CLI, read back offline with the ``rocrate`` library:
the stages, the parameters (the run's override included) and the digests of input and output files."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from rocrate.rocrate import ROCrate

RECIPE = """\
habitrun: 1
name: crate-study
subjects: {manifest: subjects.csv, files: [image]}
policy: {backend: serial, subject_timeout_sec: null}
stages:
  - {name: feat, operator: "study_ops:features", params: {bins: 32, window: [-1, 1]}}
  - {name: table, kind: collect, operator: "study_ops:table", needs: [feat]}
"""

OPS = '''\
from pathlib import Path


def features(subject, bins, window):
    out = subject.workdir / "features.txt"
    out.write_text(f"{subject.id} {bins} " + Path(subject.fields["image"]).read_text())
    return {"file": out, "bins": bins}


def table(collection, ):
    return {sid: Path(r["file"]).read_text() for sid, r in collection.items()}
'''


def make_study(folder: Path) -> Path:
    (folder / "data").mkdir(parents=True)
    for i in range(1, 4):
        (folder / "data" / f"s{i}.txt").write_text(f"image {i}\n")
    (folder / "subjects.csv").write_text("subject_id,image\n" + "".join(f"s{i},data/s{i}.txt\n" for i in range(1, 4)))
    (folder / "study_ops.py").write_text(OPS)
    (folder / "recipe.yaml").write_text(RECIPE)
    return folder


def cli(study: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, check=False, cwd=study)


def ident(value: object) -> str:
    """An entity's id (the library gives a reference to an entity outside the crate as its id)."""
    return value if isinstance(value, str) else value.id  # type: ignore[attr-defined]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_run_exported_as_a_workflow_run_crate_reads_back_with_its_stages_params_and_digests(tmp_path: Path) -> None:
    study = make_study(tmp_path / "study")
    done = cli(study, "run", "-q", "stages.feat.params.bins=64")
    assert done.returncode == 0, done.stdout + done.stderr
    crate_dir = tmp_path / "crate"
    done = cli(study, "export", "--ro-crate", str(crate_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 stage(s), 4 subject action(s)" in done.stdout

    crate = ROCrate(crate_dir)
    workflow = crate.mainEntity
    assert workflow.id == "recipe.yaml" and "ComputationalWorkflow" in workflow.type
    assert (crate_dir / "recipe.yaml").read_text().count("bins: 64") == 1  # the run's resolved recipe
    root_profiles = {p.id for p in crate.root_dataset["conformsTo"]}
    assert "https://w3id.org/ro/wfrun/workflow/0.5" in root_profiles

    steps = sorted(workflow["step"], key=lambda s: int(s["position"]))
    assert [s["name"] for s in steps] == ["feat", "table"]
    assert [s["workExample"]["name"] for s in steps] == ["feat", "table"]
    controls = {e["instrument"]["name"]: e for e in crate.get_entities() if e.type == "ControlAction"}
    assert set(controls) == {"feat", "table"}
    feat_actions = [a for a in controls["feat"]["object"] if a.type == "CreateAction"]
    assert len(feat_actions) == 1 + 3  # the stage's, and one per subject
    assert all(ident(a["actionStatus"]) == "http://schema.org/CompletedActionStatus" for a in feat_actions)

    values = {e["name"]: e["value"] for e in crate.get_entities() if e.type == "PropertyValue"}
    assert values == {"feat/bins": 64, "feat/window": "[-1, 1]"}
    params = {p["name"] for p in workflow["input"]}
    assert {"feat/bins", "feat/window", "subjects"} <= params

    run_action = crate.root_dataset["mentions"]
    run_action = run_action[0] if isinstance(run_action, list) else run_action
    assert run_action.type == "CreateAction" and run_action["instrument"].id == "recipe.yaml"
    inputs = {e["name"]: e for e in run_action["object"] if e.type == "File"}
    assert set(inputs) == {"data/s1.txt", "data/s2.txt", "data/s3.txt"}
    for name, entity in inputs.items():
        assert entity["sha256"] == sha256(study / name)
    outputs = {e.id: e for e in run_action["result"]}
    work = sorted((study / ".habitrun" / "work" / "feat").rglob("features.txt"))
    assert len(work) == 3
    for path in work:
        assert outputs[path.as_uri()]["sha256"] == sha256(path)
    s1 = next(a for a in feat_actions if a["name"] == "feat of s1")
    assert [f["name"] for f in s1["object"] if f.type == "File"] == ["data/s1.txt"]
    assert [f.id for f in s1["result"]] == [p.as_uri() for p in work if "s1" in p.parts]

    env = json.loads((crate_dir / "environment.json").read_text())
    engine = crate.get("#habitrun")
    assert {r["name"] for r in engine["softwareRequirements"]} >= set(env["distributions"])


def test_a_large_run_keeps_one_action_per_stage_and_bad_input_is_a_usage_error(tmp_path: Path) -> None:
    study = make_study(tmp_path / "study")
    no_run = cli(study, "export", "--ro-crate", str(tmp_path / "c0"))
    assert no_run.returncode == 2 and "no run yet" in no_run.stderr, no_run.stderr
    assert cli(study, "run", "-q").returncode == 0
    done = cli(study, "export", "--ro-crate", str(tmp_path / "c1"), "--max-subject-actions", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "one action per stage only" in done.stdout
    crate = ROCrate(tmp_path / "c1")
    actions = [e for e in crate.get_entities() if e.type == "CreateAction"]
    assert sorted(a["name"].split(" (")[0] for a in actions if a.id.count("/") == 1) == [
        "Run of stage feat", "Run of stage table"]
    assert len(actions) == 3  # the run and its two stages

    for args, message in ((("export",), "--ro-crate DIR"),
                          (("export", "--ro-crate", str(tmp_path / "c2"), "--run", "nope"), "no run 'nope'"),
                          (("export", "--ro-crate", str(study / "data")), "not an empty folder")):
        bad = cli(study, *args)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
