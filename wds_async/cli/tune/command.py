"""The ``wds-async tune`` command around :func:`wds_async.cli.tune.recommend.tune`: arguments, the live display,
the table, ``--json`` and ``--plot`` (matplotlib, the ``tune`` extra, drawn without pyplot's global state)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ...errors import MissingDependency, WdsError
from .recommend import (
    DEFAULT_LEVELS,
    MAX_THROTTLED,
    TOLERANCE,
    Measurement,
    TuneResult,
    size_text,
    throttled_fraction,
    tune,
)

__all__ = ["add_arguments", "command", "format_table", "save_plot"]


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints such as 1,4,16, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"levels must be positive ints, got {text!r}")
    return values


def _sizes(text: str) -> list[int]:
    from ...config import check_size
    from ...node import parse_bytes

    try:  # the engine's floor for part_bytes: a tiny part size would plan millions of parts per object
        return [check_size("part_bytes", parse_bytes(x, "--part-bytes"), shown="--part-bytes", zero=False)
                for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("urls", nargs="+", help="shard URLs, brace patterns or globs (the first 1024 objects are read)")
    p.add_argument("--levels", type=_ints, default=list(DEFAULT_LEVELS), metavar="N,N,...",
                   help="concurrency levels to sweep (default 1,2,4,...,256)")
    p.add_argument("--max", type=_positive, default=None, dest="max_level", help="drop the levels above this")
    p.add_argument("--seconds", type=_seconds, default=3.0, help="measurement window per level (default 3)")
    p.add_argument("--part-bytes", type=_sizes, default=[], metavar="SIZE,...",
                   help="also read ranged parts of these sizes at the knee (e.g. 4MiB,16MiB)")
    p.add_argument("--full", action="store_true", help="measure every level, even past a plateau")
    p.add_argument("--ranks", type=_positive, default=1, help="ranks per node the recommendation is for")
    p.add_argument("--workers", type=_positive, default=1, help="DataLoader workers per rank")
    p.add_argument("--json", metavar="FILE", help="write every measurement and the recommendation as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="save MB/s and CPU s/GB against concurrency as a PNG "
                   "(needs matplotlib: pip install 'wds-async[tune]')")
    p.add_argument("-q", "--quiet", action="store_true", help="no live display")
    p.add_argument("--progress", action="store_true", help="show the live display even when stderr is not a "
                   "terminal")


def _row(m: Measurement) -> str:
    read = "whole" if m.part_bytes is None else size_text(m.part_bytes)
    cpu = f"{m.cpu_s_per_gb:.2f}" if m.cpu_s_per_gb is not None else "-"
    p50 = f"{m.ttfb_p50_ms:.0f} ms" if m.ttfb_p50_ms is not None else "-"
    p99 = f"{m.ttfb_p99_ms:.0f} ms" if m.ttfb_p99_ms is not None else "-"
    return (f"{m.concurrency:>6}  {read:<7}{m.mb_s:>9.1f}{cpu:>10}{p50:>10}{p99:>10}{m.requests:>10}"
            f"{m.errors:>8}{m.throttled:>11}")


def format_table(result: TuneResult) -> str:
    """The measurements, the knee and the recommendation as the CLI prints them."""
    header = f"{'conns':>6}  {'read':<7}{'MB/s':>9}{'CPU s/GB':>10}{'TTFB p50':>10}{'TTFB p99':>10}" \
             f"{'requests':>10}{'errors':>8}{'throttled':>11}"
    lines = [header, "-" * len(header)]
    lines += [_row(m) + ("   <- knee" if m.concurrency == result.knee else "") for m in result.sweep]
    lines += [_row(m) for m in result.parts]
    knee, best = result.at_knee, result.best
    lines += ["", f"knee: {result.knee} connections, {knee.mb_s:,.1f} MB/s, the smallest level within {TOLERANCE:.0%} "
              f"of the best (fastest: {best.mb_s:,.1f} MB/s at {best.concurrency})"]
    if result.stopped_early:
        lines.append(f"the sweep stopped at {result.sweep[-1].concurrency}: two levels in a row gained less than "
                     f"{TOLERANCE:.0%} (--full measures every level)")
    elif result.knee == result.levels[-1] and len(result.levels) > 1:
        lines.append("throughput still rose at the largest level: try --max or --levels higher")
    if result.throttled_from is not None:
        lines.append(f"the store throttled more than {MAX_THROTTLED:.0%} of the requests from {result.throttled_from} "
                     f"connections up; the knee is chosen below that" if result.throttled_from > result.knee else
                     f"warning: the store throttled {throttled_fraction(knee):.1%} of the requests at the knee")
    return "\n".join(lines + result.recommendation.lines())


def save_plot(result: TuneResult, path: str) -> None:
    """MB/s against concurrency (log2 axis) with CPU s/GB on a second axis and the knee marked."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependency("--plot needs matplotlib: pip install 'wds-async[tune]'") from None
    x = [m.concurrency for m in result.sweep]
    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    ax = fig.add_subplot()
    ax.plot(x, [m.mb_s for m in result.sweep], "o-", color="tab:blue", label="MB/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [str(n) for n in x])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("MB/s", color="tab:blue")
    ax.set_ylim(bottom=0)
    cpu = [(m.concurrency, m.cpu_s_per_gb) for m in result.sweep if m.cpu_s_per_gb is not None]
    ax2 = ax.twinx()
    ax2.plot([c for c, _ in cpu], [v for _, v in cpu], "s--", color="tab:orange", label="CPU s/GB")
    ax2.set_ylabel("CPU s/GB (this process)", color="tab:orange")
    ax2.set_ylim(bottom=0)
    refused = [m for m in result.sweep if throttled_fraction(m) > MAX_THROTTLED]
    if refused:
        ax.plot([m.concurrency for m in refused], [m.mb_s for m in refused], "x", color="tab:red", markersize=10,
                label=f"throttled > {MAX_THROTTLED:.0%}")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    knee = result.at_knee
    ax.axvline(knee.concurrency, color="gray", linestyle=":")
    ax.annotate(f"knee: {knee.concurrency} ({knee.mb_s:,.0f} MB/s)", (knee.concurrency, 0.95),
                xycoords=("data", "axes fraction"), textcoords="offset points", xytext=(-4, 0), ha="right",
                va="top", fontsize=9)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")


def command(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..console import progress_console

    if args.plot:
        try:
            import matplotlib  # noqa: F401  (fail before a sweep of minutes, not after it)
        except ImportError:
            raise MissingDependency("--plot needs matplotlib: pip install 'wds-async[tune]'") from None
    console, shown = progress_console(args.progress, args.quiet)
    bar = Progress(TextColumn("tune"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[label]}"),
                   TextColumn("{task.fields[rate]:,.1f} MB/s"), TimeElapsedColumn(), console=console,
                   transient=True, disable=not shown)
    task = bar.add_task("tune", total=None, label="", rate=0.0)

    def progress(done: int, total: int, label: str, rate: float) -> None:
        bar.update(task, completed=done, total=total, label=label, rate=rate)

    try:
        with bar:
            result = tune(args.urls, levels=args.levels, max_level=args.max_level, seconds=args.seconds,
                          part_bytes=args.part_bytes, full=args.full, ranks=args.ranks, workers=args.workers,
                          progress=progress)
    except ValueError as exc:
        if isinstance(exc, WdsError):
            raise
        print(f"wds-async tune: error: {exc}", file=sys.stderr)
        return 2
    print(f"tune: {result.objects} objects, {result.seconds:g} s per level")
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(_json(result), fh, indent=2)
    if args.plot:
        save_plot(result, args.plot)
    return 0


def _json(result: TuneResult) -> dict[str, Any]:
    out = result.to_dict()
    out["best"] = result.best.concurrency  # the row itself is in "sweep"
    return out
