"""The BIDS shorthand on generated BIDS trees, with and without sessions (no pybids)."""

from __future__ import annotations

from pathlib import Path

import pytest

from habitrun.errors import RecipeError
from tests.spec.test_discover import load, study

PLAIN = [f"ds/sub-{s}/anat/sub-{s}_{suffix}.nii.gz" for s in ("01", "02", "03") for suffix in ("T1w", "mask")]
SESSIONS = [f"ds/sub-{s}/ses-{v}/anat/sub-{s}_ses-{v}_{suffix}.nii.gz"
            for s in ("01", "02") for v in ("pre", "post") for suffix in ("T1w", "mask")]
NOISE = [
    "ds/dataset_description.json",
    "ds/sub-01/anat/sub-01_T1w.json",  # a sidecar: another extension
    "ds/sub-01/anat/sub-01_acq-fast_T1w.nii.gz",  # another entity: not in the covered subset
    "ds/sub-01/func/sub-01_task-rest_bold.nii.gz",  # another datatype
    "ds/sub-02/anat/sub-03_T1w.nii.gz",  # a file of another subject in the wrong folder
    "ds/derivatives/sub-01/anat/sub-01_T1w.nii.gz",
    "ds/sourcedata/x.nii.gz",
]
BIDS = "bids: ds/\ndatatype: anat\nsuffix: [T1w, mask]\n"


def test_bids_without_sessions(tmp_path: Path):
    rows = load(study(tmp_path, BIDS + "session: none\n", *PLAIN, *NOISE,
                      extra={"ds/participants.tsv": "participant_id\tage\tsex\nsub-01\t34\tF\nsub-02\t51\tM\n"}))
    assert [r.id for r in rows] == ["sub-01", "sub-02", "sub-03"]
    assert rows[0].fields == {
        "participant_id": "sub-01", "subject": "01", "session": "",
        "T1w": "ds/sub-01/anat/sub-01_T1w.nii.gz",
        "mask": "ds/sub-01/anat/sub-01_mask.nii.gz",
        "age": "34", "sex": "F",  # participants.tsv, joined on participant_id
    }
    assert rows[2].fields["age"] == ""
    assert rows.file_columns == ("T1w", "mask")


def test_bids_with_sessions_gives_one_subject_per_session(tmp_path: Path):
    rows = load(study(tmp_path, BIDS + "session: required\nrequired: [T1w, mask]\n", *SESSIONS[:-1], *PLAIN))
    assert [r.id for r in rows] == ["sub-01_ses-post", "sub-01_ses-pre", "sub-02_ses-pre"]
    assert rows[1].fields["session"] == "pre" and rows[1].fields["subject"] == "01"
    assert rows[1].fields["T1w"] == "ds/sub-01/ses-pre/anat/sub-01_ses-pre_T1w.nii.gz"
    assert rows.discovery.incomplete == [("sub-02_ses-post", ("mask",))]


def test_bids_sessions_optional_takes_both_layouts(tmp_path: Path):
    files = [*SESSIONS[:4], *[f for f in PLAIN if "sub-03" in f]]
    rows = load(study(tmp_path, BIDS, *files))
    assert [r.id for r in rows] == ["sub-01_ses-post", "sub-01_ses-pre", "sub-03"]


def test_bids_with_both_extensions_of_one_file_is_an_error(tmp_path: Path):
    recipe = study(tmp_path, BIDS, *PLAIN, "ds/sub-02/anat/sub-02_T1w.nii")
    with pytest.raises(RecipeError, match=r"subject 'sub-02' has two values for column 'T1w': "
                                          r"ds/sub-02/anat/sub-02_T1w.nii, ds/sub-02/anat/sub-02_T1w.nii.gz"):
        load(recipe)


def test_bids_with_no_match_says_where_it_looked(tmp_path: Path):
    recipe = study(tmp_path, BIDS.replace("anat", "dwi"), *PLAIN)
    with pytest.raises(RecipeError) as err:
        load(recipe)
    text = str(err.value)
    assert "recipe.yaml:4:9: subjects.bids: no file matches the BIDS layout 'ds/' (datatype dwi, suffix T1w, mask)" in text
    assert "nearest existing path" in text and "anat" in text


def test_bids_subject_labels_can_be_constrained(tmp_path: Path):
    rows = load(study(tmp_path, BIDS + 'fields: {subject: "0[12]"}\n', *PLAIN))
    assert [r.id for r in rows] == ["sub-01", "sub-02"]
