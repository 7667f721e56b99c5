"""The HTML report, opened in a real headless Chromium with networking off."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from habitrun.cli.htmlreport.charts import MAX_BARS
from habitrun.cli.htmlreport.gather import ReportData, StageInfo
from habitrun.cli.htmlreport.page import build_report
from habitrun.store.trace import TRACE_COLUMNS, stage_stats
from tests.engine.study import run_cli
from tests.trace.study import write_study

HOSTILE = "<script>alert(2)</script>"


def _browser():
    """A headless Chromium driven by selenium, or a skip saying what is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        reason = "headless Chromium is not installed (apt-get install chromium chromium-driver; .ci/run does)"
        print(reason)
        pytest.skip(reason)
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,2400", "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
                "--host-resolver-rules=MAP * ~NOTFOUND"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))


@pytest.fixture
def study_report(tmp_path: Path) -> Path:
    rows = [{"subject_id": f"S{i:02d}", "mb": i % 5, "mode": "sleep", "sec": 0.01 * (i % 4)} for i in range(24)]
    rows[3]["fail"] = "bad <img src=x onerror=alert(1)>"
    rows[5]["fail"] = "[/x] not markup"
    rows.append({"subject_id": HOSTILE, "fail": "hostile id"})
    recipe = write_study(tmp_path / "study", rows, policy={"workers": 2}, stages="three")
    assert run_cli("run", str(recipe), "-q").returncode == 1
    out = tmp_path / "report.html"
    done = run_cli("report", str(recipe), "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.timeout(180)
def test_report_opens_offline_in_chromium_and_draws(study_report: Path, tmp_path: Path) -> None:
    text = study_report.read_text()
    assert HOSTILE not in text and "&lt;script&gt;alert(2)&lt;/script&gt;" in text
    assert "<img src=x" not in text
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in text
    driver = _browser()
    try:
        driver.get(study_report.as_uri())
        deadline = time.monotonic() + 20
        while driver.execute_script("return document.body.getAttribute('data-ready')") != "1":
            assert time.monotonic() < deadline, "the report's script never ran"
            time.sleep(0.1)
        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert errors == [], errors
        assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert driver.execute_script("return document.scripts.length") == 1
        charts = driver.execute_script("""
            return Array.from(document.querySelectorAll('svg.chart')).map(function (svg) {
              var box = svg.getBoundingClientRect();
              var drawn = Array.from(svg.querySelectorAll('rect.bar, rect.span')).filter(function (r) {
                var b = r.getBBox(); return b.width > 0 && b.height > 0; }).length;
              return {cls: svg.getAttribute('class'), w: box.width, h: box.height, drawn: drawn,
                      limits: svg.querySelectorAll('.limit, .limit-label').length};
            });""")
        hists = [c for c in charts if "hist" in c["cls"]]
        timelines = [c for c in charts if "timeline" in c["cls"]]
        # 2 map stages x (duration, memory); the collect stage's one attempt is a line, not two one-bar charts
        assert len(hists) == 4 and len(timelines) == 1, charts
        assert driver.execute_script("return document.querySelectorAll('.card.compact').length") == 1
        for chart in charts:
            assert chart["w"] > 100 and chart["h"] > 40 and chart["drawn"] > 0, chart
        assert all(c["limits"] for c in hists[0::2]), "the timeout is drawn on every duration histogram"
        assert timelines[0]["drawn"] >= 24
        body = driver.execute_script("return document.body.innerText")
        assert HOSTILE in body and "[/x] not markup" in body and "bad <img src=x onerror=alert(1)>" in body
        failures = driver.execute_script("return document.querySelectorAll('tr.failure').length")
        assert failures == 3
        driver.execute_script("document.querySelector('button.toggle').click()")
        shown = driver.execute_script("var p = document.querySelector('pre.log'); return [p.hidden, p.innerText]")
        assert shown[0] is False and "Error: subject" in shown[1]  # the log's last lines, the traceback's end
        shot = tmp_path / "report.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 20_000
    finally:
        driver.quit()


def _synthetic(n: int, workers: int = 16, failed_every: int = 97) -> ReportData:
    rows = []
    t = 1_700_000_000.0
    for i in range(n):
        lane = i % workers
        start = t + (i // workers) * 0.05 + lane * 0.001
        word = "failed" if i % failed_every == 0 else "done"
        rows.append(dict.fromkeys(TRACE_COLUMNS) | {
            "run_id": "r1", "stage": "features" if i % 3 else "qc", "subject": f"sub-{i:06d}", "attempt": 1,
            "outcome": word, "kind": "exception" if word == "failed" else None,
            "error": "ValueError: <bad>" if word == "failed" else None, "started_at": start,
            "ended_at": start + 0.04, "wall_sec": 0.04, "cpu_sec": 0.03, "peak_rss_mb": 100 + i % 300,
            "pid": 1000 + lane, "host": "node1"})
    tuples = [tuple(r[c] for c in TRACE_COLUMNS) for r in rows]
    stages = [StageInfo("qc", "map", {"total": n}, 60.0, 2048.0), StageInfo("features", "map", {"total": n}, 60.0, None)]
    return ReportData("big-study", "r1", "failed", {"subjects": n}, stages, tuples, stage_stats(tuples))


def test_report_for_100000_subjects_stays_small() -> None:
    data = _synthetic(100_000)
    page = build_report(data)
    assert len(page.encode()) <= 10 * 1024 * 1024
    assert page.count('class="span agg"') > 0  # aggregated beyond MAX_BARS
    assert page.count('<rect class="span ') < 100_000
    small = build_report(_synthetic(MAX_BARS - 1))
    assert small.count('class="span agg"') == 0
