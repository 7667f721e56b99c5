"""The report shows the science: collect tables, distributions with outliers named, params and overrides,
what changed since the previous run, the environment lock; a single attempt is one line; in Chromium."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from habitrun.cli.htmlreport.page import build_report
from habitrun.cli.htmlreport.science import (
    MAX_COLUMNS,
    OUTLIER_Z,
    Science,
    distribution,
    distributions,
    summarize,
    tables_of,
)
from tests.trace.test_report import _browser, _synthetic

OPS = '''
from pathlib import Path

def measure(subject, scale=1.0):
    n = int(subject.id[1:])
    volume = 1000.0 + 10 * (n % 5) if subject.id != "S07" else 90000.0  # S07: a broken scan
    return {"volume": volume * scale, "flat": 1.0, "shape": {"sphericity": 0.5 + n / 100}, "label": "x<b>"}

def table(results):
    path = results.workdir / "features.csv"
    with open(path, "w") as fh:
        fh.write("subject_id,volume,site\\n")
        for sid in sorted(results):
            fh.write(f"{sid},{results[sid]['volume']},site<{int(sid[1:]) % 2}>\\n")
    return {"table": str(path), "n": len(results)}
'''

RECIPE = """\
habitrun: 1
name: science
subjects: {manifest: subjects.csv}
policy: {workers: 2}
stages:
  - {name: measure, operator: "ops:measure", params: {scale: 1.0}}
  - {name: table, kind: collect, operator: "ops:table", needs: [measure]}
"""


def habitrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "habitrun.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env={**os.environ, "COLUMNS": "400"})
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def test_outliers_are_named_by_the_median_and_mad_not_the_mean():
    pairs = [(f"S{i:02d}", 10.0 + (i % 3)) for i in range(40)] + [("BAD", 500.0), ("LOW", -3.0)]
    d = distribution("s", "volume", pairs, total=43)
    assert [sid for sid, _, _ in d.outliers] == ["BAD", "LOW"]
    assert d.missing == 1 and d.values == 42 and d.median == 11.0
    assert all(abs(z) > OUTLIER_Z for _, _, z in d.outliers)
    assert sum(d.counts) == 42


def test_a_column_without_spread_is_constant_and_a_lone_difference_is_an_outlier():
    flat = distribution("s", "flat", [(f"S{i}", 1.0) for i in range(10)], total=10)
    assert flat.constant and not flat.outliers and sum(flat.counts) == 10
    lone = distribution("s", "flat", [(f"S{i}", 1.0) for i in range(10)] + [("ODD", 1.5)], total=11)
    assert [sid for sid, _, z in lone.outliers] == ["ODD"] and math.isinf(lone.outliers[0][2])


def test_numeric_columns_of_map_results_nested_one_level_most_common_first():
    results = {f"S{i}": {"a": i, "b": {"c": 2.0 * i, "d": {"too": 1}}, "s": "text", "ok": True} for i in range(6)}
    results["S9"] = {"only_here": 1}
    names = [d.column for d in distributions("st", results)]
    assert names == ["a", "b.c"]  # strings, booleans, a third level and a column most lack are left out
    wide = {f"S{i}": {f"c{j:03d}": float(i + j) for j in range(MAX_COLUMNS + 5)} for i in range(3)}
    assert len(distributions("st", wide)) == MAX_COLUMNS


def test_column_summaries():
    num = summarize("v", ["1", "2", "", "4"])
    assert num.numeric and num.count == 3 and num.missing == 1 and num.median == 2.0 and num.high == 4.0
    text = summarize("site", ["a", "b", "a", "1"])
    assert not text.numeric and text.distinct == 3 and text.top[0] == ("a", 2)


def test_tables_a_collect_result_is_or_names(tmp_path):
    work = tmp_path / "work"
    (work / "t").mkdir(parents=True)
    inside = work / "t" / "features.tsv"
    inside.write_text("id\tx\nA\t1\nB\t2\n")
    outside = tmp_path / "elsewhere.csv"
    outside.write_text("id,x\nA,1\n")
    (found,) = tables_of("t", {"table": str(inside), "input": str(outside)}, work)
    assert found.name == "features.tsv" and found.columns == ["id", "x"] and found.total_rows == 2
    (listed,) = tables_of("t", [{"id": "A", "x": 1}, {"id": "B", "y": 2}], work)
    assert listed.columns == ["id", "x", "y"] and listed.rows[1] == ["B", "", "2"]
    pd = pytest.importorskip("pandas", reason="the tables extra")
    (frame,) = tables_of("t", pd.DataFrame({"id": ["A"], "x": [1.5]}), work)
    assert frame.columns == ["id", "x"] and frame.rows == [["A", "1.5"]]
    assert tables_of("t", {"n": 3}, work) == []


def test_report_with_results_for_100000_subjects_stays_small():
    data = _synthetic(100_000)
    results = {f"sub-{i:06d}": {f"feature_{j:02d}": (i * 7919 + j) % 1000 / 10.0 for j in range(30)}
               for i in range(100_000)}
    rows = [[f"sub-{i:06d}", str(i % 1000), "site"] for i in range(100_000)]
    from habitrun.cli.htmlreport.science import preview
    science = Science(tables=[preview("table", "features.csv", ["subject_id", "x", "site"], rows)],
                      distributions={"features": distributions("features", results)},
                      params={"features": {"bins": 32}}, environment={"distributions": {f"p{i}": "1.0" for i in range(500)}},
                      previous_run="r0", changes=["run r0 -> run r1", "  recipe: stages.features.params.bins: 16 -> 32"])
    data.science = science
    page = build_report(data)
    assert len(page.encode()) <= 10 * 1024 * 1024, len(page.encode())
    assert page.count('class="tile"') == 30 and "100,000 row(s)" in page


@pytest.mark.timeout(300)
def test_the_report_shows_results_params_changes_and_environment_in_chromium(tmp_path: Path):
    study = tmp_path / "study"
    study.mkdir()
    (study / "ops.py").write_text(OPS)
    (study / "subjects.csv").write_text("subject_id\n" + "".join(f"S{i:02d}\n" for i in range(1, 13)))
    (study / "recipe.yaml").write_text(RECIPE)
    assert habitrun("run", "recipe.yaml", "-q", cwd=study).returncode == 0
    second = habitrun("run", "recipe.yaml", "-q", "stages.measure.params.scale=2.0", cwd=study)
    assert second.returncode == 0, second.stdout + second.stderr
    out = tmp_path / "report.html"
    done = habitrun("report", "recipe.yaml", "-o", str(out), cwd=study)
    assert done.returncode == 0, done.stdout + done.stderr
    page = out.read_text()

    results = page[page.index('<section id="results">'):page.index('<section id="parameters">')]
    assert "features.csv" in results and "12 row(s) × 3 column(s)" in results
    assert "site&lt;1&gt;" in results and "site<1>" not in results  # cells are data, escaped
    outliers = re.findall(r'<div class="outliers">(.*?)</div>', results)
    assert any("<code>S07</code>" in o for o in outliers), outliers  # the broken scan, named
    assert "every subject has the same value" in results  # the flat column
    assert "shape.sphericity" in results
    params = page[page.index('<section id="parameters">'):page.index('<section id="changes">')]
    assert "stages.measure.params.scale=2.0" in params and "<code>2.0</code>" in params
    changes = page[page.index('<section id="changes">'):page.index('<section id="environment">')]
    assert "scale" in changes and "1.0" in changes and "2.0" in changes
    environment = page[page.index('<section id="environment">'):page.index('<section id="resources">')]
    assert f"{sys.version_info.major}.{sys.version_info.minor}." in environment and "installed distribution" in environment
    resources = page[page.index('<section id="resources">'):page.index('<section id="timeline">')]
    assert 'class="card compact"' in resources  # the collect stage's one attempt: a line

    driver = _browser()
    try:
        driver.get(out.as_uri())
        driver.find_element("css selector", "body[data-ready='1']")
        for section in ("results", "parameters", "changes", "environment"):
            assert driver.find_element("id", section).is_displayed()
        tiles = driver.find_elements("css selector", "#results .tile svg.spark rect.bar")
        assert tiles and all(t.size["height"] > 0 for t in tiles)
        shot = tmp_path / "report-science.png"
        driver.set_window_size(1300, 4000)
        assert driver.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        print(f"screenshot kept: {shot}")
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()
