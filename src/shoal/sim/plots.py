"""PNG plots of replays, one line per policy: utilisation over time and queueing-delay CDF.

matplotlib (the ``sim`` extra) is imported here only, with the file-only Agg backend.
"""

from __future__ import annotations

from pathlib import Path

from shoal.sim.report import PolicyReport

_HOUR = 3600.0


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed: ``pip install 'shoal[sim]'``."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotsUnavailable(
            "plots need matplotlib: pip install 'shoal[sim]' (or pass --no-plots)"
        ) from None
    return plt


def write_plots(reports: list[PolicyReport], out_dir: Path, title: str) -> list[Path]:
    """Write utilisation.png and wait_cdf.png to ``out_dir``; return their paths."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    resource = reports[0].share_resource.upper() if reports else "GPU"
    paths = []

    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    for r in reports:
        series = r.series_gpu if resource == "GPU" else r.series_cpu
        hours = [t / _HOUR for t in r.series_t]
        mean = r.gpu_utilisation if resource == "GPU" else r.cpu_utilisation
        ax.step(hours, [100 * u for u in series], where="post", linewidth=1.4,
                label=f"{r.label} (mean {100 * mean:.1f}%, makespan {r.makespan_s / _HOUR:.1f} h)")
    ax.set_title(f"{resource} utilisation over time: {title}")
    ax.set_xlabel("virtual time since first submit (hours)")
    ax.set_ylabel(f"{resource}s in use (% of cluster)")
    ax.set_ylim(0, 105)
    ax.set_xlim(left=0)
    ax.grid(True, alpha=0.3)
    _legend_below(ax)
    paths.append(out_dir / "utilisation.png")
    fig.savefig(paths[-1], bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    for r in reports:
        xs = sorted(max(w, 0.0) / 60 for w in r.waits)
        if not xs:
            continue
        n = len(xs)
        # A log axis cannot show 0: jobs that started at once sit at the left edge.
        floor = 1 / 60
        ax.step([max(x, floor) for x in xs], [100 * (k + 1) / n for k in range(n)], where="post",
                linewidth=1.4, label=f"{r.label} (median {r.wait.median / 60:.1f} min, "
                                     f"p99 {r.wait.p99 / 60:.0f} min)")
    ax.set_xscale("log")
    ax.set_title(f"Queueing delay CDF: {title}")
    ax.set_xlabel("queueing delay, start - submit (minutes, log scale; <1 s shown at 1 s)")
    ax.set_ylabel("jobs started within that delay (%)")
    ax.set_ylim(0, 101)
    ax.grid(True, which="both", alpha=0.3)
    _legend_below(ax)
    paths.append(out_dir / "wait_cdf.png")
    fig.savefig(paths[-1], bbox_inches="tight")
    plt.close(fig)
    return paths


def _legend_below(ax) -> None:
    """Under the axes, so no line is hidden behind it, however many policies there are."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(2, len(labels)),
                  fontsize=9, frameon=False)
