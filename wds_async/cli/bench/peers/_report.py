"""The peers table and its bar chart: wds-async's own phases and every peer's rows, side by side.

Each row: MB/s, samples/s, CPU seconds per GB, peak RSS of the process (children included), whether
every sample (or byte, for copy tools) arrived exactly once, and the ratio to the fastest raw copy at
the same number of connections. A peer that could not run keeps its row with the reason.
"""

from __future__ import annotations

import textwrap
from typing import Any

__all__ = ["add_ratios", "format_peers_table", "plot_peers"]


def add_ratios(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Set ``vs_fastest_raw`` on every measured row; return the fastest raw row (None if none ran)."""
    equal = {r["connections"] for r in rows if r.get("peer") == "raw" and r.get("connections")}
    raw = [r for r in rows if r.get("kind") == "raw" and not r.get("error")
           and (not equal or r.get("connections") in equal)]  # "at equal connections"
    fastest = max(raw, key=lambda r: r["mb_s"], default=None)
    for r in rows:
        if not r.get("error") and fastest is not None:
            r["vs_fastest_raw"] = r["mb_s"] / fastest["mb_s"]
    return fastest


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_peers_table(rows: list[dict[str, Any]], connections: int) -> str:
    """The table ``bench --peers`` prints (and the README shows)."""
    fastest = add_ratios(rows)
    header = (f"{'':<30}{'conns':>6}{'MB/s':>8}{'samples/s':>11}{'CPU s/GB':>10}{'peak RSS MB':>13}"
              f"{'vs fastest raw':>16}  exactly once")
    lines = [header, "-" * len(header)]
    for kind, title in (("raw", "raw copy"), ("loader", "loaders")):
        lines.append(f"{title}:")
        for r in rows:
            if r.get("kind") != kind:
                continue
            if r.get("error"):
                reason = textwrap.shorten(str(r["error"]).replace("\n", " "), 150)
                lines.append(f"  {r['name']:<28}{'did not run: ' + reason}")
                continue
            lines.append(f"  {r['name']:<28}{r.get('connections') or '-':>6}{r['mb_s']:>8.1f}{_num(r.get('samples_s'), '.0f'):>11}"
                         f"{_num(r.get('cpu_s_per_gb'), '.2f'):>10}{r['peak_rss'] / 1e6:>13.0f}"
                         f"{_num(r.get('vs_fastest_raw'), '.2f'):>16}  {r.get('exactly_once', '-')}")
    if fastest is not None:
        lines.append("")
        lines.append(f"fastest raw copy at {connections} connections: {fastest['name']} ({fastest['mb_s']:.1f} MB/s)")
    ours = [r for r in rows if r.get("peer") == "wds-async" and not r.get("error")]
    others = [r for r in rows if r.get("kind") == "loader" and r.get("peer") != "wds-async"
              and not r.get("error") and r.get("samples_s")]
    if ours and others:
        best_ours = max(ours, key=lambda r: r["samples_s"])
        best_peer = max(others, key=lambda r: r["samples_s"])
        lines.append(f"wds-async best {best_ours['samples_s']:.0f} samples/s vs best peer loader "
                     f"{best_peer['name']} {best_peer['samples_s']:.0f} samples/s: "
                     f"{best_ours['samples_s'] / best_peer['samples_s']:.2f}x")
    settings = [f"  {r['name']}: {r['settings']}" for r in rows if r.get("settings")]
    if settings:
        lines.append("settings:")
        lines += settings
    return "\n".join(lines)


def plot_peers(rows: list[dict[str, Any]], path: str, title: str) -> None:
    """A horizontal bar chart of MB/s per row (failed rows shown as a labelled empty bar), as PNG."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'wds-async[tune]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    add_ratios(rows)
    # Raw copies first, then wds-async, then the peer loaders (top to bottom), each in run order.
    rows = sorted(rows, key=lambda r: 0 if r.get("kind") == "raw" else 1 if r.get("peer") == "wds-async" else 2)
    colors = {"raw": "#8c8c8c", "loader": "#4c72b0", "ours": "#dd8452"}
    names = [r["name"] for r in rows][::-1]
    values = [0.0 if r.get("error") else r["mb_s"] for r in rows][::-1]
    fills = [colors["ours"] if r.get("peer") == "wds-async" else colors[r.get("kind", "loader")] for r in rows][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.4))
    bars = ax.barh(names, values, color=fills)
    top = max(values, default=1.0) or 1.0
    for bar, r in zip(bars, rows[::-1]):
        y = bar.get_y() + bar.get_height() / 2
        if r.get("error"):
            ax.text(top * 0.01, y, "did not run: " + textwrap.shorten(str(r["error"]), 70), va="center", fontsize=7,
                    color="#b22222")
        else:
            label = f"{r['mb_s']:.0f} MB/s"
            if r.get("vs_fastest_raw") is not None:
                label += f"  ({r['vs_fastest_raw']:.2f}x)"
            ax.text(bar.get_width() + top * 0.01, y, label, va="center", fontsize=8)
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("MB/s (ratio to the fastest raw copy)")
    ax.set_title(title, fontsize=10)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=colors["raw"], label="raw copy"), Patch(color=colors["ours"], label="wds-async"),
                       Patch(color=colors["loader"], label="peer loader")], loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
