"""Laying out the report page: summary, stages, charts, timeline, failures; all in one file."""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from habitrun import __version__
from habitrun.cli.htmlreport.charts import (
    FAILED,
    RETRIED,
    esc,
    fmt,
    histogram,
    stage_colors,
    timeline,
)
from habitrun.cli.htmlreport.gather import ReportData
from habitrun.cli.htmlreport.sections import CSS as SECTIONS_CSS
from habitrun.cli.htmlreport.sections import (
    changes_section,
    compact_stage,
    environment_section,
    parameters_section,
    results_section,
)
from habitrun.cli.memory_text import memory_html
from habitrun.errors import UsageError
from habitrun.store.trace import COL

CSS = """
:root{--ink:#1f2933;--muted:#616e7c;--line:#e4e7eb;--bg:#f5f7fa;--card:#fff;--accent:#0b7285;
--ok:#2b8a3e;--bad:#c92a2a;--warn:#e67700}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
color:var(--ink);background:var(--bg)}
header{background:linear-gradient(120deg,#0b7285,#1864ab);color:#fff;padding:28px 40px 22px}
header h1{margin:0 0 4px;font-size:26px;font-weight:600;letter-spacing:.2px}
header .sub{opacity:.85;font-size:13px}
nav{position:sticky;top:0;z-index:5;background:#fff;border-bottom:1px solid var(--line);padding:0 40px}
nav a{display:inline-block;padding:10px 14px;color:var(--muted);text-decoration:none;font-weight:500}
nav a:hover{color:var(--accent)}
main{max-width:1240px;margin:0 auto;padding:24px 40px 60px}
section{margin:0 0 28px}
h2{font-size:19px;font-weight:600;margin:0 0 12px;color:#102a43}
h3{font-size:15px;font-weight:600;margin:0 0 8px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:18px 20px;
box-shadow:0 1px 2px rgba(16,42,67,.06)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:14px;margin-bottom:16px}
.stat .v{font-size:24px;font-weight:600}
.stat .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.6px}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-size:12px;font-weight:600;
text-transform:uppercase;letter-spacing:.5px;background:#e3f2fd;color:#1864ab}
.badge.success{background:#d3f9d8;color:var(--ok)}.badge.failed{background:#ffe3e3;color:var(--bad)}
.badge.interrupted{background:#fff3bf;color:var(--warn)}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:7px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--muted);font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.4px;
background:#fafbfc}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:16px}
@media(max-width:900px){.grid2{grid-template-columns:1fr}}
dl.prov{display:grid;grid-template-columns:170px 1fr;gap:4px 14px;margin:0}
dl.prov dt{color:var(--muted)}dl.prov dd{margin:0;word-break:break-all;font-family:ui-monospace,Menlo,monospace;
font-size:12.5px}
svg.chart{display:block;font-size:11px}
svg .grid{stroke:#eef1f4}svg .axis{stroke:#9aa5b1}svg .tick{fill:var(--muted)}
svg .axis-label{fill:var(--muted);font-size:11.5px}svg .empty{fill:var(--muted);font-size:13px}
svg .bar:hover,svg .span:hover{opacity:.75}
svg .limit{stroke:var(--bad);stroke-width:1.6;stroke-dasharray:5 4}
svg .limit-label{fill:var(--bad);font-size:11px;font-weight:600}
svg .lane{fill:#f8f9fb}
.legend{display:flex;flex-wrap:wrap;gap:14px;margin:6px 0 10px;color:var(--muted);font-size:12.5px}
.legend i{display:inline-block;width:12px;height:12px;border-radius:3px;margin-right:5px;vertical-align:-2px}
.muted{color:var(--muted)}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
pre.log{background:#1f2933;color:#e4e7eb;padding:8px 10px;border-radius:6px;margin:6px 0 0;
white-space:pre-wrap;word-break:break-all;max-height:220px;overflow:auto}
tr.failure td.err{color:var(--bad)}
.kind{display:inline-block;padding:1px 7px;border-radius:4px;background:#fff0f0;color:var(--bad);font-size:11.5px}
input.filter{width:320px;max-width:100%;padding:7px 10px;border:1px solid var(--line);border-radius:6px;
margin-bottom:10px;font:inherit}
button.toggle{border:0;background:none;color:var(--accent);cursor:pointer;padding:0;font:inherit;font-size:12px}
footer{color:var(--muted);font-size:12px;text-align:center;padding:20px}
"""

JS = """
(function(){
  var box=document.getElementById('failure-filter');
  if(box){box.addEventListener('input',function(){
    var q=box.value.toLowerCase();
    document.querySelectorAll('tr.failure').forEach(function(tr){
      tr.style.display=tr.textContent.toLowerCase().indexOf(q)>=0?'':'none';
    });
  });}
  document.querySelectorAll('button.toggle').forEach(function(b){
    b.addEventListener('click',function(){
      var pre=document.getElementById(b.getAttribute('data-for'));
      if(pre){var hide=pre.hidden;pre.hidden=!hide;b.textContent=hide?'hide log':'show log';}
    });
  });
  document.body.setAttribute('data-ready','1');
})();
"""


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else esc("–" if value is None else value)


def _wall(data: ReportData) -> float | None:
    summary = data.provenance.get("summary") or {}
    if summary.get("duration_sec") is not None:
        return float(summary["duration_sec"])
    starts = [r[COL["started_at"]] for r in data.rows if r[COL["started_at"]] is not None]
    ends = [r[COL["ended_at"]] for r in data.rows if r[COL["ended_at"]] is not None]
    return max(ends) - min(starts) if starts and ends else None


def _summary(data: ReportData) -> str:
    prov = data.provenance
    attempts = len(data.rows)
    failed = sum(1 for r in data.rows if r[COL["outcome"]] == "failed")
    cpu = sum(r[COL["cpu_sec"]] or 0.0 for r in data.rows)
    cards = [
        ("outcome", f'<span class="badge {esc(data.outcome)}">{esc(data.outcome)}</span>'),
        ("subjects", _count(prov.get("subjects"))),
        ("attempts run", f"{attempts:,}"),
        ("failed", f"{failed:,}"),
        ("wall time", esc(fmt(_wall(data), "s"))),
        ("CPU time", esc(fmt(cpu, "s"))),
    ]
    out = ['<section id="summary"><div class="cards">']
    for key, value in cards:
        out.append(f'<div class="card stat"><div class="k">{key}</div><div class="v">{value}</div></div>')
    out.append("</div>")
    reason = (prov.get("summary") or {}).get("stop_reason")
    if reason:
        out.append(f'<p class="muted">stopped: {esc(reason)}</p>')
    out.append(_cohort(data))
    out.append("</section>")
    return "".join(out)


def _cohort(data: ReportData) -> str:
    """The cohort line: found → incomplete (why, who) → excluded → in the run → what each collect/train took."""
    if data.cohort is None:
        return ""
    flow = data.cohort.line(data.members) or data.cohort.flow_text()
    out = [f'<p id="cohort"><b>cohort</b>: {esc(flow)}</p>']
    out.extend(f'<p class="muted">refused: {esc(message)}</p>' for message in data.refused)
    return "".join(out)


def _stages(data: ReportData) -> str:
    head = ("stage", "kind", "total", "done", "cached", "failed", "skipped", "not run",
            "median", "p95", "max", "peak mem median", "p95", "max")
    out = ['<section id="stages"><h2>Stages</h2><div class="card"><table><thead><tr>']
    out.extend(f'<th class="{"" if i < 2 else "n"}">{esc(h)}</th>' for i, h in enumerate(head))
    out.append("</tr></thead><tbody>")
    for stage in data.stages:
        c = stage.counts
        st = data.stats.get(stage.name, {})
        d, m = st.get("duration_sec", {}), st.get("peak_rss_mb", {})
        cells = [c.get("total"), c.get("done"), c.get("cached"), c.get("failed"), c.get("skipped"), c.get("not_run")]
        out.append(f"<tr><td>{esc(stage.name)}</td><td>{esc(stage.kind)}</td>")
        out.extend(f'<td class="n">{_count(v)}</td>' for v in cells)
        out.extend(f'<td class="n">{esc(fmt(d.get(k), "s"))}</td>' for k in ("median", "p95", "max"))
        out.extend(f'<td class="n">{esc(fmt(m.get(k), "MB"))}</td>' for k in ("median", "p95", "max"))
        out.append("</tr>")
    out.append("</tbody></table></div></section>")
    return "".join(out)


def _provenance(data: ReportData) -> str:
    prov = data.provenance
    git = prov.get("git") or {}
    recipe = prov.get("recipe") or {}
    backend = prov.get("backend") or {}
    commit = git.get("commit")
    items = [
        ("recipe", recipe.get("path")), ("recipe sha256", recipe.get("sha256")),
        ("git commit", f"{commit}{' (uncommitted changes)' if git.get('dirty') else ''}" if commit else "not in git"),
        ("run", data.run_id), ("overrides", " ".join(str(o) for o in prov.get("overrides") or []) or "none"),
        ("resumed from", prov.get("resumed_from") or "–"),
        ("started", prov.get("started_at")), ("ended", prov.get("ended_at") or "–"),
        ("user @ host", f"{prov.get('user', '?')} @ {prov.get('host', '?')}"),
        ("command", " ".join(str(a) for a in prov.get("argv") or [])),
        ("backend", ", ".join(f"{k}={v}" for k, v in backend.items())),
        ("habitrun", prov.get("habitrun")), ("python", prov.get("python")), ("platform", prov.get("platform")),
    ]
    packages = prov.get("operator_packages") or {}
    if packages:
        items.append(("operator packages", "; ".join(_packages_text(k, v) for k, v in packages.items())))
    out = ['<section id="provenance"><h2>Provenance</h2><div class="card"><dl class="prov">']
    out.extend(f"<dt>{esc(k)}</dt><dd>{esc('–' if v is None else v)}</dd>" for k, v in items)
    out.append("</dl></div></section>")
    return "".join(out)


def _packages_text(name: str, value: object) -> str:
    """One entry of provenance's operator_packages: per stage {distribution: version} (per module before)."""
    if isinstance(value, dict):
        return f"{name}: {', '.join(f'{d} {v}' for d, v in value.items()) or '(none)'}"
    return f"{name} {value or '(local)'}"


def _science(data: ReportData, colors: dict[str, str]) -> str:
    """Results, parameters, environment and changes (sections.py), when the report gathered them."""
    sci = data.science
    if sci is None:
        return ""
    return "".join((results_section(sci.tables, sci.distributions, colors, sci.note),
                    parameters_section(sci.params, sci.overrides), changes_section(sci.previous_run, sci.changes),
                    environment_section(sci.environment)))


def _charts(data: ReportData, colors: dict[str, str]) -> str:
    out = ['<section id="resources"><h2>Duration and memory per stage</h2>']
    by_stage: dict[str, list[tuple]] = {}
    for row in data.rows:
        by_stage.setdefault(row[COL["stage"]], []).append(row)
    shown = False
    for stage in data.stages:
        rows = by_stage.get(stage.name)
        if not rows:
            continue
        shown = True
        color = colors[stage.name]
        walls = [r[COL["wall_sec"]] for r in rows if r[COL["wall_sec"]] is not None]
        peaks = [r[COL["peak_rss_mb"]] for r in rows if r[COL["peak_rss_mb"]] is not None]
        if len(rows) == 1:  # a collect or train stage's one attempt: a line, not two one-bar histograms
            out.append(compact_stage(stage.name, 1, walls[0] if walls else None, peaks[0] if peaks else None))
            continue
        out.append(f'<div class="card" style="margin-bottom:14px"><h3>{esc(stage.name)} '
                   f'<span class="muted">· {len(rows):,} attempt(s)</span></h3><div class="grid2">')
        out.append("<div>" + histogram(walls, unit="s", color=color, limit=stage.timeout_sec,
                                       limit_label="timeout", label="duration") + "</div>")
        out.append("<div>" + histogram(peaks, unit="MB", color=color, limit=stage.memory_limit_mb,
                                       limit_label="memory limit", label="peak memory") + "</div>")
        out.append("</div></div>")
    if not shown:
        out.append('<div class="card muted">no subject ran in this run (everything was cached, or it stopped first)</div>')
    out.append("</section>")
    return "".join(out)


def _timeline(data: ReportData, colors: dict[str, str]) -> str:
    legend = "".join(f'<span><i style="background:{c}"></i>{esc(name)}</span>' for name, c in colors.items())
    legend += f'<span><i style="background:{FAILED}"></i>failed</span><span><i style="background:{RETRIED}"></i>retried</span>'
    note = ""
    if len(data.rows) > 3000:
        note = ('<p class="muted">Many attempts: each lane is drawn in time slices, coloured by the stage that '
                'kept it busiest and as opaque as it was busy; failures are marked in red.</p>')
    return (f'<section id="timeline"><h2>Timeline</h2><div class="card"><div class="legend">{legend}</div>{note}'
            f'{timeline(data.rows, colors)}</div></section>')


def _failures(data: ReportData) -> str:
    out = ['<section id="failures"><h2>Failures</h2><div class="card">']
    if not data.failures:
        out.append('<p class="muted">no subject failed in this run</p></div></section>')
        return "".join(out)
    out.append('<input id="failure-filter" class="filter" type="search" placeholder="filter failures…">')
    out.append("<table><thead><tr><th>stage</th><th>subject</th><th class=n>attempt</th><th>kind</th>"
               "<th>error</th><th class=n>duration</th></tr></thead><tbody>")
    for i, f in enumerate(data.failures):
        tail = "\n".join(f["tail"])
        log_cell = ""
        if f["tail"]:
            log_cell = (f'<br><button class="toggle" data-for="log{i}">show log</button>'
                        f'<pre class="log" id="log{i}" hidden>{esc(tail)}</pre>')
        if f["log"]:
            log_cell += f'<div class="muted"><code>{esc(f["log"])}</code></div>'
        out.append(f'<tr class="failure"><td>{esc(f["stage"])}</td><td><code>{esc(f["subject"])}</code></td>'
                   f'<td class="n">{esc(f["attempt"])}</td><td><span class="kind">{esc(f["kind"] or "?")}</span></td>'
                   f'<td class="err">{esc(f["error"] or "")}{log_cell}</td>'
                   f'<td class="n">{esc(fmt(f["wall_sec"], "s"))}</td></tr>')
    out.append("</tbody></table>")
    if data.more_failures:
        out.append(f'<p class="muted">… and {data.more_failures:,} more (habitrun trace lists them all)</p>')
    out.append("</div></section>")
    return "".join(out)


def build_report(data: ReportData) -> str:
    """The whole page as one string: no external file, font, script or network request."""
    colors = stage_colors([s.name for s in data.stages])
    title = f"{data.recipe_name} · run {data.run_id}"
    generated = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = "".join((_summary(data), _stages(data), memory_html(data.provenance), _science(data, colors),
                    _charts(data, colors),
                    _timeline(data, colors), _failures(data), _provenance(data)))
    sections = [("summary", "Summary"), ("stages", "Stages")]
    if data.science is not None:
        sections += [("results", "Results"), ("parameters", "Parameters"), ("changes", "Changes"),
                     ("environment", "Environment")]
    sections += [("resources", "Resources"), ("timeline", "Timeline"), ("failures", "Failures"),
                 ("provenance", "Provenance")]
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in sections)
    return (
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        "script-src 'unsafe-inline'; img-src data:\">"
        f"<title>{esc(title)}</title><style>{CSS}{SECTIONS_CSS}</style></head><body>"
        f"<header><h1>{esc(data.recipe_name)}</h1><div class=\"sub\">run {esc(data.run_id)} · "
        f"{esc(data.provenance.get('started_at', ''))} · <span class=\"badge {esc(data.outcome)}\">"
        f"{esc(data.outcome)}</span></div></header><nav>{nav}</nav><main>{body}</main>"
        f"<footer>habitrun {esc(__version__)} · report written {esc(generated)}</footer>"
        f"<script>{JS}</script></body></html>"
    )


def write_report(data: ReportData, path: Path) -> Path:
    """Write the page atomically (a reader never sees half a report)."""
    text = build_report(data)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write the report to {path}: {exc.strerror or exc}") from None
    return path

