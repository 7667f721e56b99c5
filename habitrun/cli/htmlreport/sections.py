"""The report's sections about the science: results (tables, distributions), parameters, environment, changes.

Each function takes plain data (science.py, the run folder's files) and returns escaped HTML; the
page (page.py) places them. Every user value (ids, column names, cells, params, package names) passes
through ``esc``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from habitrun.cli.htmlreport.charts import esc, fmt
from habitrun.cli.htmlreport.science import Distribution, TablePreview

SPARK_W, SPARK_H = 240, 58
MAX_PACKAGES_LISTED = 2000


def _num(value: float | None) -> str:
    if value is None:
        return "–"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:,.4g}"
    return f"{value:.3e}"


def spark(d: Distribution, color: str) -> str:
    """A small histogram of one column, the median as a line, outliers' bins in red."""
    peak = max(d.counts) or 1
    bar_w = SPARK_W / len(d.counts)
    span = d.high - d.low
    bad_bins = set()
    for _, value, _z in d.outliers:
        bad_bins.add(min(len(d.counts) - 1, int((value - d.low) / span * len(d.counts))) if span > 0 else 0)
    parts = [f'<svg class="chart spark" viewBox="0 0 {SPARK_W} {SPARK_H}" width="{SPARK_W}" height="{SPARK_H}" '
             f'role="img" aria-label="{esc(d.column)}" xmlns="http://www.w3.org/2000/svg">']
    for i, count in enumerate(d.counts):
        if not count:
            continue
        h = max(1.5, count / peak * (SPARK_H - 4))
        fill = "#e15759" if i in bad_bins else color
        lo = d.low + span * i / len(d.counts)
        parts.append(f'<rect class="bar" x="{i * bar_w + 0.5:.1f}" y="{SPARK_H - h:.1f}" width="{max(1.0, bar_w - 1):.1f}" '
                     f'height="{h:.1f}" fill="{fill}"><title>{esc(_num(lo))}…: {count:,}</title></rect>')
    if span > 0:
        x = (d.median - d.low) / span * SPARK_W
        parts.append(f'<line class="median" x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{SPARK_H}" stroke="#1f2933" '
                     f'stroke-dasharray="3 3"/>')
    parts.append("</svg>")
    return "".join(parts)


def _cell(text: str) -> str:
    """A numeric cell shortened to six significant digits (the full value is its hover text)."""
    try:
        value = float(text)
    except ValueError:
        return text
    return text if len(text) <= 10 or not value == value else f"{value:.6g}"


def _table_html(columns: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    out = ["<div class=\"scroll\"><table class=\"data\"><thead><tr>"]
    out.extend(f'<th class="{"n" if i in numeric else ""}">{esc(c)}</th>' for i, c in enumerate(columns))
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="n" title="{esc(cell)}">{esc(_cell(cell))}</td>' if i in numeric
                                    else f"<td>{esc(cell)}</td>" for i, cell in enumerate(row)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def table_card(t: TablePreview) -> str:
    """A collect table: how big, its first rows, then one line per column."""
    numeric = {i for i, s in enumerate(t.summaries) if s.numeric}
    more = "+" if t.truncated else ""
    out = [f'<div class="card table-preview" style="margin-bottom:14px"><h3>{esc(t.stage)} '
           f'<span class="muted">· {esc(t.name)} · {t.total_rows:,}{more} row(s) × {len(t.columns):,} column(s)</span></h3>']
    out.append(_table_html(t.columns, t.rows, numeric))
    if t.total_rows > len(t.rows):
        out.append(f'<p class="muted">first {len(t.rows)} of {t.total_rows:,}{more} rows</p>')
    out.append('<details><summary>column summaries</summary><table class="data"><thead><tr><th>column</th>'
               '<th class=n>values</th><th class=n>missing</th><th class=n>mean</th><th class=n>sd</th>'
               '<th class=n>min</th><th class=n>median</th><th class=n>max</th><th>distinct / commonest</th>'
               '</tr></thead><tbody>')
    for s in t.summaries:
        if s.numeric:
            stats = "".join(f'<td class="n">{esc(_num(v))}</td>' for v in (s.mean, s.sd, s.low, s.median, s.high))
            kinds = f"{s.distinct:,} distinct"
        else:
            stats = '<td class="n">–</td>' * 5
            kinds = f"{s.distinct:,} distinct: " + ", ".join(f"{v} ({n:,})" for v, n in s.top)
        flag = ' class="warn"' if s.missing else ""
        out.append(f"<tr><td>{esc(s.name)}</td><td class=n>{s.count:,}</td><td class=n{flag}>{s.missing:,}</td>"
                   f"{stats}<td>{esc(kinds)}</td></tr>")
    out.append("</tbody></table></details></div>")
    return "".join(out)


def distributions_card(stage: str, dists: Sequence[Distribution], color: str) -> str:
    """A map stage's numeric result columns: a small histogram each, with its outliers named."""
    if not dists:
        return ""
    subjects = max(d.values + d.missing for d in dists)
    flagged = sum(1 for d in dists if d.outliers)
    out = [f'<div class="card dists" style="margin-bottom:14px"><h3>{esc(stage)} <span class="muted">· '
           f'{len(dists)} numeric column(s) over {subjects:,} subject(s); outliers in {flagged}</span></h3>'
           '<div class="tiles">']
    for d in dists:
        note = ""
        if d.constant:
            note = '<div class="warn">every subject has the same value</div>'
        named = ""
        if d.outliers:
            items = ", ".join(f"<code>{esc(sid)}</code> {esc(_num(v))}" for sid, v, _z in d.outliers)
            more = f" and {d.more_outliers:,} more" if d.more_outliers else ""
            named = f'<div class="outliers">outliers: {items}{esc(more)}</div>'
        missing = f", {d.missing:,} without it" if d.missing else ""
        out.append(f'<div class="tile"><div class="col">{esc(d.column)}</div>{spark(d, color)}'
                   f'<div class="muted">median {esc(_num(d.median))} · range {esc(_num(d.low))} – {esc(_num(d.high))}'
                   f' · {d.values:,} value(s){esc(missing)}</div>{note}{named}</div>')
    out.append("</div></div>")
    return "".join(out)


def results_section(tables: Sequence[TablePreview], dists: Mapping[str, Sequence[Distribution]],
                    colors: Mapping[str, str], note: str | None = None) -> str:
    out = ['<section id="results"><h2>Results</h2>']
    if note:
        out.append(f'<p class="muted">{esc(note)}</p>')
    out.extend(table_card(t) for t in tables)
    out.extend(distributions_card(stage, ds, colors.get(stage, "#4e79a7")) for stage, ds in dists.items())
    if not tables and not any(dists.values()):
        out.append('<div class="card muted">no table and no numeric result to show</div>')
    out.append("</section>")
    return "".join(out)


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def parameters_section(params: Mapping[str, Mapping[str, Any]], overrides: Sequence[str]) -> str:
    """Each stage's params as the run resolved them, and the overrides it was given."""
    out = ['<section id="parameters"><h2>Parameters</h2><div class="card">']
    given = " ".join(overrides)
    out.append(f'<p><b>overrides</b>: {f"<code>{esc(given)}</code>" if given else "none (the recipe file as it is)"}</p>')
    out.append("<table><thead><tr><th>stage</th><th>param</th><th>value</th></tr></thead><tbody>")
    for stage, values in params.items():
        if not values:
            out.append(f'<tr><td>{esc(stage)}</td><td class="muted" colspan=2>no params</td></tr>')
        for name, value in values.items():
            out.append(f"<tr><td>{esc(stage)}</td><td><code>{esc(name)}</code></td><td><code>{esc(_value(value))}</code></td></tr>")
    out.append("</tbody></table></div></section>")
    return "".join(out)


def environment_section(env: Mapping[str, Any] | None) -> str:
    """The run's environment lock: interpreter, habitrun, the study's commit, each stage's packages, all."""
    out = ['<section id="environment"><h2>Environment</h2><div class="card">']
    if not env:
        out.append('<p class="muted">this run wrote no environment lock (environment.json): '
                   "made by a habitrun before the lock existed</p></div></section>")
        return "".join(out)
    python = env.get("python") or {}
    repo = env.get("git") or {}
    where = env.get("platform") or {}
    items = [("python", f"{python.get('version', '?')} ({python.get('implementation', '?')})" if isinstance(python, Mapping) else python),
             ("platform", where.get("platform") if isinstance(where, Mapping) else where), ("habitrun", env.get("habitrun"))]
    if isinstance(repo, Mapping) and repo:
        dirty = repo.get("dirty_files") or {}
        items.append(("study commit", f"{repo.get('commit') or repo.get('status') or 'not in git'}"
                      + (f" ({len(dirty)} file(s) with uncommitted changes)" if dirty else "")))
    out.append('<dl class="prov">')
    out.extend(f"<dt>{esc(k)}</dt><dd>{esc('–' if v is None else v)}</dd>" for k, v in items)
    out.append("</dl>")
    stages = env.get("stages") or {}
    if isinstance(stages, Mapping) and stages:
        out.append('<table style="margin-top:10px"><thead><tr><th>stage</th><th>code</th><th>packages it imports</th>'
                   "</tr></thead><tbody>")
        for stage, info in stages.items():
            info = info if isinstance(info, Mapping) else {}
            packages = info.get("packages") or {}
            text = ", ".join(f"{n} {v}" for n, v in packages.items()) if isinstance(packages, Mapping) else str(packages)
            out.append(f"<tr><td>{esc(stage)}</td><td><code>{esc(str(info.get('code') or '–')[:16])}</code></td>"
                       f"<td>{esc(text or '(none)')}</td></tr>")
        out.append("</tbody></table>")
    dists = env.get("distributions") or {}
    if isinstance(dists, Mapping) and dists:
        listed = list(dists.items())[:MAX_PACKAGES_LISTED]
        out.append(f'<details style="margin-top:10px"><summary>{len(dists):,} installed distribution(s)</summary>'
                   '<p class="packages"><code>' + esc(", ".join(f"{n}=={v}" for n, v in listed)) + "</code></p></details>")
    out.append("</div></section>")
    return "".join(out)


def changes_section(previous: str | None, lines: Sequence[str]) -> str:
    """What changed since the study's run before this one (habitrun diff's words)."""
    out = ['<section id="changes"><h2>Since the previous run</h2><div class="card">']
    if previous is None:
        out.append('<p class="muted">this is the study\'s first run: nothing to compare with</p>')
    else:
        out.append(f'<pre class="diff">{esc(chr(10).join(lines))}</pre>')
    out.append("</div></section>")
    return "".join(out)


CSS = """
.scroll{overflow-x:auto}table.data td{white-space:nowrap}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:12px}
.tile{border:1px solid var(--line);border-radius:6px;padding:8px 10px;font-size:12px}
.tile .col{font-weight:600;font-size:13px;margin-bottom:2px;word-break:break-all}
.outliers{color:var(--bad);margin-top:2px}.warn{color:var(--warn);font-weight:600}
pre.diff{background:#f8f9fb;border:1px solid var(--line);border-radius:6px;padding:8px 10px;white-space:pre-wrap;
margin:0}p.packages{max-height:160px;overflow:auto;word-break:break-all}
details summary{cursor:pointer;color:var(--accent)}
.compact{display:flex;gap:24px;flex-wrap:wrap}
"""


def compact_stage(name: str, attempts: int, wall: float | None, peak: float | None) -> str:
    """A stage with one attempt (a collect or train stage): one line, not two one-bar histograms."""
    return (f'<div class="card compact" style="margin-bottom:14px"><h3 style="margin:0">{esc(name)} '
            f'<span class="muted">· {attempts} attempt</span></h3><span>duration <b>{esc(fmt(wall, "s"))}</b></span>'
            f'<span>peak memory <b>{esc(fmt(peak, "MB"))}</b></span></div>')
