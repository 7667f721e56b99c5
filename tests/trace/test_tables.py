"""`habitrun results`, `habitrun.results()`, `habitrun trace` and the status numbers, on a real 3-stage study."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import habitrun
from tests.engine.study import run_cli
from tests.trace.study import write_study

pd = pytest.importorskip("pandas", reason="pandas is not installed (the tables extra)")


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [{"subject_id": f"S{i}", "mb": i, "mode": "sleep", "sec": 0.01} for i in range(6)]
    rows[2]["fail"] = "broken, on purpose"
    recipe = write_study(tmp_path_factory.mktemp("tables"), rows, policy={"workers": 2, "auto_retry_rounds": 0},
                         stages="three")
    assert run_cli("run", str(recipe), "-q").returncode == 1
    return recipe


def test_results_of_a_map_stage_are_one_flattened_row_per_subject(study: Path, tmp_path: Path) -> None:
    out = tmp_path / "use.csv"
    done = run_cli("results", str(study), "use", "-o", str(out), "--manifest", "--meta")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out, index_col="subject_id", keep_default_na=False, na_values=[""])
    assert list(table.index) == [f"S{i}" for i in range(6)]
    for column in ("status", "error", "duration_sec", "peak_rss_mb", "id", "size.mb", "size.label", "n", "mb"):
        assert column in table.columns, column
    assert table.loc["S4", "size.mb"] == 4 and table.loc["S4", "size.label"] == "<b>S4</b>"
    assert table.loc["S2", "status"] == "failed" and "broken, on purpose" in table.loc["S2", "error"]
    assert pd.isna(table.loc["S2", "size.mb"])
    assert (table.drop(index="S2")["status"] == "done").all()
    assert (table.drop(index="S2")["peak_rss_mb"] > 0).all()


def test_parquet_csv_and_dataframe_agree(study: Path, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (the tables extra)")
    for name in ("double.csv", "double.parquet", "double.tsv", "double.jsonl"):
        assert run_cli("results", str(study), "double", "-o", str(tmp_path / name), "--meta").returncode == 0
    frame = habitrun.results(study, "double", meta=True)
    csv = pd.read_csv(tmp_path / "double.csv", index_col="subject_id")
    parquet = pd.read_parquet(tmp_path / "double.parquet").set_index("subject_id")
    tsv = pd.read_csv(tmp_path / "double.tsv", sep="\t", index_col="subject_id")
    jsonl = pd.read_json(tmp_path / "double.jsonl", lines=True, precise_float=True).set_index("subject_id")
    assert frame.index.name == "subject_id" and len(frame) == 6
    assert frame.loc["S4", "twice"] == 4 and frame.loc["S4", "nested.deep.x"] == 1
    assert frame.loc["S2", "status"] == "skipped"
    for other in (csv, parquet, tsv, jsonl):
        assert list(other.columns) == list(frame.columns)
        assert list(other.index) == list(frame.index)
        for column in ("status", "twice", "nested.deep.x", "duration_sec", "peak_rss_mb"):
            left = frame[column].astype(object).where(frame[column].notna(), None).tolist()
            right = other[column].astype(object).where(other[column].notna(), None).tolist()
            assert left == right, column


def test_collect_stage_comes_out_as_json_and_bad_requests_exit_2(study: Path, tmp_path: Path) -> None:
    out = tmp_path / "total.json"
    assert run_cli("results", str(study), "total", "-o", str(out)).returncode == 0
    assert json.loads(out.read_text()) == {"count": 5}
    for args in (("results", str(study), "nope"), ("results", str(study), "total", "-o", str(tmp_path / "t.csv")),
                 ("results", str(study), "use", "-o", str(tmp_path / "t.xlsx")),
                 ("trace", str(study), "--run", "no-such-run")):
        done = run_cli(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr and "error:" in done.stderr, args


def test_trace_command_writes_every_attempt(study: Path, tmp_path: Path) -> None:
    assert run_cli("trace", str(study), "-o", str(tmp_path / "t.csv")).returncode == 0
    table = pd.read_csv(tmp_path / "t.csv")
    assert len(table) == 6 + 5 + 1  # use (one failed), double (the failed one's downstream skipped), total
    assert set(table["outcome"]) == {"done", "failed"}
    assert run_cli("trace", str(study), "--stage", "use", "-o", str(tmp_path / "t.jsonl"), "--run", "all").returncode == 0
    lines = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and {row["stage"] for row in lines} == {"use"}
    failed = next(row for row in lines if row["outcome"] == "failed")
    assert failed["subject"] == "S2" and failed["kind"] == "exception" and failed["log"]


def test_status_carries_duration_and_memory_spreads(study: Path) -> None:
    done = run_cli("status", str(study), "--json")
    resources = json.loads(done.stdout)["resources"]
    use = resources["use"]
    assert use["attempts"] == 6 and len(use["slowest"]) == 5
    assert use["duration_sec"]["median"] <= use["duration_sec"]["p95"] <= use["duration_sec"]["max"]
    assert use["peak_rss_mb"]["max"] >= 5
    text = run_cli("status", str(study)).stdout
    assert "slowest in use" in text and "memory median" in text


def test_import_is_cheap_and_missing_pandas_is_a_clear_message(study: Path) -> None:
    code = ("import sys, habitrun; assert 'pandas' not in sys.modules and 'habitrun.planner' not in sys.modules; "
            "sys.modules['pandas'] = None\n"
            "from habitrun.errors import MissingExtra\n"
            f"try:\n    habitrun.results({str(study)!r}, 'use')\nexcept MissingExtra as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'habitrun[tables]'" in done.stdout
