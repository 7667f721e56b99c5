"""Charts as inline SVG, drawn here: histograms with a limit line, and the worker timeline.

Every number is laid out in Python, so the page needs no charting library
and shows its charts even with JavaScript off; hover text is SVG ``<title>``.
All user text passes through :func:`esc`. The timeline draws one bar per
attempt up to ``MAX_BARS``; past that each lane is cut into ``COLUMNS``
time slices, each drawn once, coloured by the stage that kept it busiest
and as opaque as it was busy, so 100,000 subjects stay a small, quick page.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from habitrun.cli.text import human as fmt
from habitrun.store.trace import COL

PALETTE = ("#4e79a7", "#59a14f", "#9c755f", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#bab0ac",
           "#86bcb6", "#8cd17d")
FAILED = "#e15759"
RETRIED = "#f28e2b"
MAX_BARS = 3000
COLUMNS = 600
MAX_MARKS = 2000  # failure marks drawn on an aggregated timeline


def esc(text: Any) -> str:
    """User text for HTML or SVG (element text and attribute values alike)."""
    return html.escape(str(text), quote=True)


def nice_step(span: float, ticks: int = 5) -> float:
    raw = span / max(1, ticks)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * power:
            return mult * power
    return 10 * power


def _axis_unit(upper: float, unit: str) -> tuple[float, str]:
    """Seconds below one are shown in ms (or µs) on an axis."""
    if unit == "s" and upper < 1e-3:
        return 1e6, "µs"
    if unit == "s" and upper < 1:
        return 1e3, "ms"
    return 1.0, unit


def stage_colors(names: Sequence[str]) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def histogram(values: Sequence[float], *, unit: str, color: str, limit: float | None, limit_label: str,
              label: str, bins: int = 30, width: int = 520, height: int = 210) -> str:
    """An SVG histogram of ``values`` with a dashed line at ``limit`` (or a note when off scale)."""
    left, right, top, bottom = 48, 14, 22, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    parts = [f'<svg class="chart hist" viewBox="0 0 {width} {height}" width="100%" role="img" '
             f'aria-label="{esc(label)}" xmlns="http://www.w3.org/2000/svg">']
    if not values:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" class="empty" text-anchor="middle">'
                     f'nothing measured</text></svg>')
        return "".join(parts)
    high = max(values)
    show_limit = limit is not None and limit <= 4 * max(high, 1e-9)
    upper = max(high, limit if show_limit and limit is not None else 0.0)
    upper = upper * 1.05 if upper > 0 else 1.0
    step = nice_step(upper)
    upper = math.ceil(upper / step) * step
    factor, axis_unit = _axis_unit(upper, unit)
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, int(value / upper * bins))] += 1
    peak = max(counts)
    ystep = max(1, int(nice_step(peak, 4)))
    ymax = max(ystep, math.ceil(peak / ystep) * ystep)
    # grid and axes
    for count_tick in range(0, ymax + 1, ystep):
        y = top + plot_h - count_tick / ymax * plot_h
        parts.append(f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{count_tick}</text>')
    tick = 0.0
    while tick <= upper + 1e-12:
        x = left + tick / upper * plot_w
        parts.append(f'<text class="tick" x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">'
                     f'{esc(fmt(tick * factor))}</text>')
        tick += step
    parts.append(f'<text class="axis-label" x="{left + plot_w / 2}" y="{height - 2}" text-anchor="middle">'
                 f'{esc(label)} ({esc(axis_unit)})</text>')
    bar_w = plot_w / bins
    for i, count in enumerate(counts):
        if not count:
            continue
        h = count / ymax * plot_h
        lo, hi = i * upper / bins, (i + 1) * upper / bins
        parts.append(f'<rect class="bar" x="{left + i * bar_w + 0.5:.1f}" y="{top + plot_h - h:.1f}" '
                     f'width="{max(bar_w - 1, 1):.1f}" height="{h:.1f}" fill="{color}">'
                     f'<title>{count} subject(s): {esc(fmt(lo, unit))} – {esc(fmt(hi, unit))}</title></rect>')
    parts.append(f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}"/>')
    if limit is not None:
        if show_limit:
            x = left + limit / upper * plot_w
            parts.append(f'<line class="limit" x1="{x:.1f}" x2="{x:.1f}" y1="{top - 6}" y2="{top + plot_h}"/>'
                         f'<text class="limit-label" x="{x - 4:.1f}" y="{top - 9}" text-anchor="end">'
                         f'{esc(limit_label)} {esc(fmt(limit, unit))}</text>')
        else:
            parts.append(f'<text class="limit-label" x="{left + plot_w}" y="{top - 9}" text-anchor="end">'
                         f'{esc(limit_label)} {esc(fmt(limit, unit))} → (off the scale)</text>')
    parts.append("</svg>")
    return "".join(parts)


def assign_lanes(rows: Sequence[tuple]) -> tuple[list[int], list[str]]:
    """A lane per worker: rows packed by start time, each lane kept by one pid while it can be.

    Returns each row's lane and each lane's label. Isolated mode (a new pid per
    subject) packs into as many lanes as ran at once, i.e. one per worker slot.
    """
    start, end, pid, host = COL["started_at"], COL["ended_at"], COL["pid"], COL["host"]
    starts = [row[start] or 0.0 for row in rows]
    order = sorted(range(len(rows)), key=starts.__getitem__)
    free_at: list[float] = []  # per lane: when its last bar ended
    lanes_of_host: dict[str, list[int]] = {}
    lane_of_pid: dict[tuple[str, int | None], int] = {}
    lane_of = [0] * len(rows)
    labels: list[str] = []
    for i in order:
        row = rows[i]
        h, p = row[host] or "?", row[pid]
        s = starts[i]
        e = row[end] or s
        lane = lane_of_pid.get((h, p))
        if lane is None or free_at[lane] > s + 1e-3:
            lane = None
            lanes = lanes_of_host.setdefault(h, [])
            for candidate in lanes:
                if free_at[candidate] <= s + 1e-3:
                    lane = candidate
                    break
            if lane is None:
                lane = len(labels)
                lanes.append(lane)
                free_at.append(0.0)
                labels.append(f"{h} · worker {len(lanes)}")
            lane_of_pid[(h, p)] = lane
        free_at[lane] = e
        lane_of[i] = lane
    return lane_of, labels


def timeline(rows: Sequence[tuple], colors: dict[str, str], *, width: int = 1100) -> str:
    """The run's attempts on one lane per worker, coloured by stage; failures in red."""
    rows = [r for r in rows if r[COL["started_at"]] is not None]
    if not rows:
        return '<svg class="chart timeline" viewBox="0 0 600 60" width="100%" xmlns="http://www.w3.org/2000/svg">' \
               '<text x="300" y="34" text-anchor="middle" class="empty">no attempts were traced</text></svg>'
    start, end = COL["started_at"], COL["ended_at"]
    lane_of, labels = assign_lanes(rows)
    t0 = min(r[start] for r in rows)
    t1 = max(r[end] or r[start] for r in rows)
    span = max(t1 - t0, 1e-6)
    left, right, top = 150, 14, 10
    lane_h = 16 if len(labels) <= 40 else max(4, 640 // len(labels))
    plot_w = width - left - right
    height = top + lane_h * len(labels) + 34
    scale = plot_w / span
    parts = [f'<svg class="chart timeline" viewBox="0 0 {width} {height}" width="100%" role="img" '
             f'aria-label="timeline" xmlns="http://www.w3.org/2000/svg">']
    for i, label in enumerate(labels):
        y = top + i * lane_h
        if i % 2 == 0:
            parts.append(f'<rect class="lane" x="{left}" y="{y}" width="{plot_w}" height="{lane_h}"/>')
        if lane_h >= 10:
            parts.append(f'<text class="tick" x="{left - 6}" y="{y + lane_h * 0.72:.1f}" text-anchor="end">'
                         f'{esc(label)}</text>')
    step = nice_step(span, 8)
    tick = 0.0
    axis_y = top + lane_h * len(labels)
    while tick <= span + 1e-9:
        x = left + tick * scale
        parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{axis_y}"/>'
                     f'<text class="tick" x="{x:.1f}" y="{axis_y + 14}" text-anchor="middle">{esc(fmt(tick, "s"))}</text>')
        tick += step
    parts.append(f'<text class="axis-label" x="{left + plot_w / 2}" y="{height - 3}" text-anchor="middle">'
                 f'time since the first subject started</text>')
    bar_h = max(2, lane_h - 4)
    if len(rows) <= MAX_BARS:
        parts.extend(_bars(rows, lane_of, colors, t0, scale, left, top, lane_h, bar_h))
    else:
        parts.extend(_aggregated(rows, lane_of, len(labels), colors, t0, span, left, top, lane_h, bar_h, plot_w))
    parts.append("</svg>")
    return "".join(parts)


def _bars(rows: Sequence[tuple], lane_of: list[int], colors: dict[str, str], t0: float, scale: float,
          left: int, top: int, lane_h: int, bar_h: int) -> list[str]:
    out = []
    start, end, stage, outcome = COL["started_at"], COL["ended_at"], COL["stage"], COL["outcome"]
    for row, lane in zip(rows, lane_of, strict=True):
        x = left + (row[start] - t0) * scale
        w = max(1.0, ((row[end] or row[start]) - row[start]) * scale)
        word = row[outcome]
        fill = FAILED if word == "failed" else RETRIED if word == "retried" else colors.get(row[stage], PALETTE[0])
        tip = (f"{row[COL['subject']]} · {row[stage]} · attempt {row[COL['attempt']]} · {word} · "
               f"{fmt(row[COL['wall_sec']], 's')} · peak {fmt(row[COL['peak_rss_mb']], 'MB')}")
        out.append(f'<rect class="span {esc(word)}" x="{x:.1f}" y="{top + lane * lane_h + (lane_h - bar_h) / 2:.1f}" '
                   f'width="{w:.1f}" height="{bar_h}" fill="{fill}"><title>{esc(tip)}</title></rect>')
    return out


def _aggregated(rows: Sequence[tuple], lane_of: list[int], lanes: int, colors: dict[str, str], t0: float,
                span: float, left: int, top: int, lane_h: int, bar_h: int, plot_w: int) -> list[str]:
    start, end, stage, outcome = COL["started_at"], COL["ended_at"], COL["stage"], COL["outcome"]
    names = list(colors) + sorted({r[stage] for r in rows} - set(colors))
    index = {name: k for k, name in enumerate(names)}
    width = len(names)
    slice_sec = span / COLUMNS
    last_col = COLUMNS - 1
    busy = [0.0] * (lanes * COLUMNS * width)  # (lane, column, stage) -> seconds busy
    started = [0] * (lanes * COLUMNS)
    marks: list[tuple[Any, int]] = []
    for row, lane in zip(rows, lane_of, strict=True):
        s = row[start] - t0
        e = (row[end] or row[start]) - t0
        if e < s:
            e = s
        first = int(s / slice_sec)
        if first > last_col:
            first = last_col
        last = int(e / slice_sec)
        if last > last_col:
            last = last_col
        base = lane * COLUMNS
        started[base + first] += 1
        k = index[row[stage]]
        if first == last:
            busy[(base + first) * width + k] += e - s
        else:
            for col in range(first, last + 1):
                busy[(base + col) * width + k] += min(e, (col + 1) * slice_sec) - max(s, col * slice_sec)
        if row[outcome] != "done" and len(marks) < MAX_MARKS:
            marks.append((row, lane))
    col_w = plot_w / COLUMNS
    out = []
    for cell in range(lanes * COLUMNS):
        by_stage = busy[cell * width:(cell + 1) * width]
        total = sum(by_stage)
        if total <= 0 and not started[cell]:
            continue
        lane, col = divmod(cell, COLUMNS)
        name = names[max(range(width), key=by_stage.__getitem__)]
        fraction = min(1.0, total / slice_sec)
        out.append(f'<rect class="span agg" x="{left + col * col_w:.1f}" y="{top + lane * lane_h + (lane_h - bar_h) / 2:.1f}" '
                   f'width="{col_w + 0.3:.2f}" height="{bar_h}" fill="{colors.get(name, PALETTE[0])}" '
                   f'fill-opacity="{0.25 + 0.75 * fraction:.2f}"><title>{started[cell]} started · '
                   f'mostly {esc(name)} · busy {fraction:.0%}</title></rect>')
    scale = plot_w / span
    for row, lane in marks:
        x = left + (row[start] - t0) * scale
        out.append(f'<rect class="span mark {esc(row[outcome])}" x="{x:.1f}" y="{top + lane * lane_h:.1f}" width="2" '
                   f'height="{lane_h}" fill="{FAILED if row[outcome] == "failed" else RETRIED}"><title>'
                   f'{esc(row[COL["subject"]])} · {esc(row[stage])} · {esc(row[outcome])}: {esc(row[COL["error"]] or "")}'
                   f'</title></rect>')
    return out
