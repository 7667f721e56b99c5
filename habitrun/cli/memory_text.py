"""What `plan`, `status` and the report say about a memory budget: predicted peaks, waits, prediction errors.

`plan` predicts each map stage's peaks the way a run would (the trace's
history of the same code, then a fit over the subjects' features) and says
whether any subject exceeds the budget (it would run alone). `status` and
the report read what the run's process backend recorded in the run's
provenance: the budget and where it came from, and per stage how long
subjects waited for memory, how many ran alone or were retried alone after
an out-of-memory kill, and how far the predictions were from the measured peaks.
"""

from __future__ import annotations

from typing import Any

from habitrun.cli.text import esc


def run_memory(info: dict[str, Any]) -> dict[str, Any] | None:
    """The budget and per-stage admission facts of a run (from its provenance), or None without a budget."""
    backends = (info.get("summary") or {}).get("backends") or []
    found: dict[str, Any] | None = None
    for described in backends:
        memory = described.get("memory") if isinstance(described, dict) else None
        if not memory:
            continue
        if found is None:
            found = {"budget_mb": memory.get("budget_mb"), "source": memory.get("source"), "stages": {}}
        found["stages"].update(memory.get("stages") or {})
    return found


def _mb(value: Any) -> str:
    return "?" if value is None else f"{float(value):.0f} MB"


def memory_lines(memory: dict[str, Any]) -> list[str]:
    """Console lines (escaped) for `status`: the budget, then one line per stage."""
    lines = [f"memory budget {_mb(memory.get('budget_mb'))} ({esc(str(memory.get('source') or ''))})"]
    for name, st in (memory.get("stages") or {}).items():
        parts = [f"predicted peak max {_mb(st.get('predicted_max_mb'))}"]
        if st.get("waits"):
            parts.append(f"{st['waits']} waited for memory ({st['wait_sec']:.1f} s in all, "
                         f"longest {st['wait_max_sec']:.1f} s)")
        if st.get("ran_alone"):
            parts.append(f"{st['ran_alone']} ran alone")
        if st.get("oom_retried_alone"):
            parts.append(f"{st['oom_retried_alone']} killed for memory and retried alone")
        if st.get("recycled_workers"):
            parts.append(f"{st['recycled_workers']} grown worker(s) recycled")
        if st.get("over_budget"):
            parts.append("over the budget: " + ", ".join(st["over_budget"]))
        if st.get("predicted_subjects"):
            rel = st.get("median_rel_error")
            parts.append(f"predicted vs measured: median off by {_mb(st.get('median_abs_error_mb'))}"
                         + (f" ({rel:.0%})" if rel is not None else "")
                         + f" over {st['predicted_subjects']}, {st.get('under_predicted', 0)} under-predicted")
        lines.append(f"  {esc(name)}: " + esc("; ".join(parts)))
    return lines


def plan_memory(loaded: Any, plan: Any, store: Any, subjects: Any) -> dict[str, dict[str, Any]]:
    """Per map stage whose policy sets a memory budget: the predicted peaks (max, p95) against the budget."""
    from habitrun.planner.peak_history import spread_of, stage_model, wants_forecast

    out: dict[str, dict[str, Any]] = {}
    rows = None
    for stage in plan:
        policy = loaded.recipe.stage_policy(stage.name)
        if not wants_forecast(policy, stage.kind):
            continue
        from habitrun.planner.memory_budget import (
            plan_budget,  # only with a budget: it reads the cgroup
        )

        if rows is None:
            rows = {row.id: row.fields for row in subjects}
        sids = stage.to_run() or list(stage.keys)
        model = stage_model(loaded, store, stage.name, stage.key_prefix, {sid: rows[sid] for sid in sids if sid in rows},
                            policy.memory_hint, subjects)
        budget, source = plan_budget(policy.memory_budget_mb)
        out[stage.name] = {**spread_of(model, sids, budget), "subjects": len(sids), "source": source}
    return out


def plan_memory_lines(memory: dict[str, dict[str, Any]]) -> list[str]:
    """Console lines (escaped) for `plan`: per stage, the predicted peaks and what exceeds the budget."""
    lines = []
    for name, st in memory.items():
        if not st["predicted"]:
            what = ("no peak known yet (nothing of this code measured): the first subject runs alone, unless each "
                    "worker's share of the budget is roomy (20 fresh workers, at least 600 MB)")
        else:
            over = (f"{st['over_budget']} over the budget (each runs alone)" if st["over_budget"]
                    else "none over the budget")
            what = (f"predicted peak max {_mb(st['max_mb'])}, p95 {_mb(st['p95_mb'])} "
                    f"({st['predicted']} of {st['subjects']} subjects); {over}")
        lines.append(f"memory {esc(name)}: {esc(what)}; budget {_mb(st['budget_mb'])} ({esc(st['source'])})")
    return lines


def memory_html(info: dict[str, Any]) -> str:
    """The report's memory section (empty without a budget): the budget, then per stage what admission did."""
    from html import escape

    memory = run_memory(info)
    if memory is None:
        return ""
    head = ("stage", "predicted max", "waited", "wait total", "longest", "ran alone", "OOM retried alone",
            "recycled", "predicted", "median abs error", "median rel error", "under-predicted")
    out = [f'<section id="memory"><h2>Memory budget</h2><div class="card"><p>budget '
           f'<b>{escape(_mb(memory.get("budget_mb")))}</b> ({escape(str(memory.get("source") or ""))})</p>'
           '<table><thead><tr>']
    out.extend(f'<th class="{"" if i == 0 else "n"}">{escape(h)}</th>' for i, h in enumerate(head))
    out.append("</tr></thead><tbody>")
    for name, st in (memory.get("stages") or {}).items():
        rel = st.get("median_rel_error")
        cells = (_mb(st.get("predicted_max_mb")), st.get("waits", 0), f"{st.get('wait_sec', 0.0):.1f} s",
                 f"{st.get('wait_max_sec', 0.0):.1f} s", st.get("ran_alone", 0), st.get("oom_retried_alone", 0),
                 st.get("recycled_workers", 0), st.get("predicted_subjects", 0),
                 _mb(st.get("median_abs_error_mb")) if st.get("median_abs_error_mb") is not None else "–",
                 f"{rel:.0%}" if rel is not None else "–", st.get("under_predicted", 0))
        out.append(f"<tr><td>{escape(name)}</td>")
        out.extend(f'<td class="n">{escape(str(c))}</td>' for c in cells)
        out.append("</tr>")
        if st.get("over_budget"):
            out.append(f'<tr><td></td><td colspan="{len(head) - 1}" class="muted">over the budget, ran alone: '
                       f'{escape(", ".join(st["over_budget"]))}</td></tr>')
    out.append("</tbody></table></div></section>")
    return "".join(out)
