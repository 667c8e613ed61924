"""main's history as pictures: a PNG (matplotlib) and a Mermaid ``xychart-beta`` block for comments.

PNG: two panels over the commits, oldest on the left. Top: TTFT p50 and p90 in ms, each flagged
lasting shift as a red line at its first commit with the levels before and after drawn as red
steps. Bottom: the census total (all operator calls of one request, summed over the profiled image
sizes). A commit whose census changed has a purple dotted line through both panels.

Mermaid has no vertical markers: the block draws p50 and p90 of the last commits, and the lines
under it name the flagged shifts and census changes. Mermaid gets numbers and commit hashes (hex,
checked by the store's schema) only, never free text from a run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from guard.files import write_atomic
from guard.history.analysis import Row, short

P50, P90, SHIFT, CENSUS, CENSUS_FILL = "#1F77B4", "#9ECAE9", "#D62728", "#7B3294", "#C2A5CF"
MERMAID_LAST = 30
AXIS_HEX = 5  # a Mermaid axis label: the commit's first hex digits
MAX_TICKS = 40


def _tick_step(n: int) -> int:
    return max(1, -(-n // MAX_TICKS))


def _draw_census(ax: Any, xs: list[int], census: list[int | None]) -> None:
    """The bottom panel: the census total as steps, a gap where a run recorded none."""
    if any(c is not None for c in census):
        ax.step(xs, [c if c is not None else float("nan") for c in census], where="mid", color=CENSUS, linewidth=1.6)
        ax.fill_between(xs, [c if c is not None else 0 for c in census], step="mid", color=CENSUS_FILL, alpha=0.35)
        known = [c for c in census if c is not None]
        lo, hi = min(known), max(known)
        pad = max((hi - lo) * 0.25, hi * 0.02, 1)
        ax.set_ylim(max(0, lo - pad), hi + pad)
    else:
        ax.text(0.5, 0.5, "no census recorded", transform=ax.transAxes, ha="center", va="center", color="grey")
    ax.set_ylabel("census: op calls\nper request", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)


def write_png(rows: Sequence[Row], path: Path | str, *, title: str) -> None:
    """Write the chart (atomically: a temp file in the target's folder, then ``os.replace``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("no history to chart")
    xs = list(range(len(rows)))
    nan = float("nan")  # an ops-only record: a gap in the TTFT lines, a point in the census
    p50 = [r.record.ttft_p50_ms if r.record.has_ttft else nan for r in rows]
    p90 = [r.record.ttft_p90_ms if r.record.has_ttft else nan for r in rows]
    census = [r.record.census_calls if r.record.census else None for r in rows]
    timed = [v for v in p50 if v == v]

    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(max(8.0, min(18.0, 0.22 * len(rows) + 4)), 6.4),
                                      gridspec_kw={"height_ratios": [3, 1.3], "hspace": 0.08}, dpi=110)
    top.plot(xs, p50, color=P50, marker="o", markersize=3.5, linewidth=1.6, label="TTFT p50", zorder=3)
    top.plot(xs, p90, color=P90, marker=".", linewidth=1.2, label="TTFT p90", zorder=2)
    top.set_ylabel("TTFT (ms)")
    top.grid(axis="y", alpha=0.3)
    if timed:
        top.set_ylim(bottom=max(0.0, min(timed) * 0.9))
    else:
        top.text(0.5, 0.5, "no TTFT recorded (ops-only runs)", transform=top.transAxes, ha="center", va="center",
                 color="grey")

    edges = [0, *[i for i, r in enumerate(rows) if r.shift is not None], len(rows)]
    for i, r in enumerate(rows):
        if r.census_changed:
            for ax in (top, bottom):
                ax.axvline(i - 0.5, color=CENSUS, linestyle=":", linewidth=1.4)
        if r.shift is not None:
            top.axvline(i - 0.5, color=SHIFT, linestyle="--", linewidth=1.4)
            k = edges.index(i)
            top.hlines(r.shift.before, edges[k - 1] - 0.3, i - 0.5, color=SHIFT, linewidth=2, alpha=0.55)
            top.hlines(r.shift.after, i - 0.5, edges[k + 1] - 0.7, color=SHIFT, linewidth=2, alpha=0.55)
            top.annotate(f"{r.shift.shift_pct:+.0f} % from {short(r.record.commit)}", xy=(i - 0.5, 1.0),
                         xycoords=("data", "axes fraction"), xytext=(4, -14), textcoords="offset points",
                         color=SHIFT, fontsize=9, fontweight="bold",
                         bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5})

    handles, labels = top.get_legend_handles_labels()
    from matplotlib.lines import Line2D

    if any(r.shift for r in rows):
        handles.append(Line2D([], [], color=SHIFT, linestyle="--"))
        labels.append("lasting TTFT shift (change point)")
    if any(r.census_changed for r in rows):
        handles.append(Line2D([], [], color=CENSUS, linestyle=":"))
        labels.append("census changed")
    top.legend(handles, labels, loc="lower left", fontsize=8, framealpha=0.9, ncol=2)
    top.set_title(title, fontsize=11)

    _draw_census(bottom, xs, census)

    step = _tick_step(len(rows))
    ticks = xs[::step]
    bottom.set_xticks(ticks)
    bottom.set_xticklabels([short(rows[i].record.commit) for i in ticks], rotation=90, fontsize=7, family="monospace")
    bottom.set_xlim(-0.7, len(rows) - 0.3)
    bottom.set_xlabel(f"commit of main, oldest first ({len(rows)} runs"
                      + (f", one in {step} labelled" if step > 1 else "") + ")", fontsize=9)
    fig.subplots_adjust(left=0.09, right=0.98, top=0.93, bottom=0.16)

    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"), suffix=".png")
    finally:
        plt.close(fig)


def mermaid(rows: Sequence[Row], *, last: int = MERMAID_LAST) -> list[str]:
    """A fenced ``mermaid`` block (p50 and p90 of the last ``last`` commits) and one line under it."""
    rows = [r for r in rows if r.record.has_ttft][-last:]  # the chart is TTFT's; ops-only records have none
    if not rows:
        return []
    p50 = [r.record.ttft_p50_ms for r in rows]
    p90 = [r.record.ttft_p90_ms for r in rows]
    lo, hi = min(p50), max(p90)
    pad = max((hi - lo) * 0.1, hi * 0.01)
    # xychart-beta cannot turn its labels: 5 hex digits per commit, 36 px each, keep them apart
    init = {"xyChart": {"width": max(600, 36 * len(rows)), "height": 420, "xAxis": {"labelFontSize": 10}},
            "themeVariables": {"xyChart": {"plotColorPalette": f"{P50}, {P90}"}}}
    lines = [
        "```mermaid",
        f"%%{{init: {json.dumps(init)}}}%%",
        "xychart-beta",
        f'    title "TTFT of main, last {len(rows)} commits (ms)"',
        "    x-axis [" + ", ".join(f'"{r.record.commit[:AXIS_HEX]}"' for r in rows) + "]",
        f'    y-axis "TTFT (ms)" {max(0.0, lo - pad):.0f} --> {hi + pad:.0f}',
        "    line [" + ", ".join(f"{v:.0f}" for v in p50) + "]",
        "    line [" + ", ".join(f"{v:.0f}" for v in p90) + "]",
        "```",
    ]
    notes = [f"Dark line: p50; light line: p90; commits by their first {AXIS_HEX} hex digits, oldest first."]
    shifts = [f"{short(r.record.commit)} ({r.shift.shift_pct:+.1f} %)" for r in rows if r.shift is not None]
    census = [short(r.record.commit) for r in rows if r.census_changed]
    notes.append(f"Lasting TTFT shift from: {', '.join(shifts)}." if shifts else "No lasting TTFT shift.")
    notes.append(f"Census changed at: {', '.join(census)}." if census else "Census unchanged.")
    return lines + [" ".join(notes)]
