"""matplotlib helpers that every fastrl figure shares: fastrl-plot's learning curves
(``fastrl.reporting.curves``) and fastrl-profile's ``--plot`` (``fastrl.profiler.plot``).

matplotlib is the optional ``plot`` extra (pip install 'fastrl[plot]'): it is imported inside
the functions, so that fastrl works without it, and ``pyplot`` turns its absence into one line
that names the extra.
"""
from __future__ import annotations

from pathlib import Path


class PlotError(ValueError):
    """A figure that cannot be drawn here; the message is one line that names the fix."""


def pyplot(option: str):
    """matplotlib.pyplot on the file-only Agg backend; PlotError naming ``option`` (the flag or
    command that asked for a figure) and the extra when matplotlib is missing. Call it before
    long work, so a missing extra fails first."""
    try:
        import matplotlib  # the optional `plot` extra
    except ImportError:
        raise PlotError(f"{option} needs matplotlib, the optional extra: pip install 'fastrl[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_path(out: str | Path, option: str) -> Path:
    """The file savefig writes for ``out``, made absolute: with ``.png`` added where the name has
    no suffix, as savefig adds it. PlotError naming ``option`` for a format matplotlib cannot
    write or a directory that does not exist."""
    from matplotlib.backend_bases import FigureCanvasBase  # the optional `plot` extra

    path = Path(out).absolute()
    if not path.suffix:
        path = path.with_name(path.name.rstrip(".") + ".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise PlotError(f"{option} {out}: matplotlib cannot write '{path.suffix}' files; end the name in one of "
                        f"{', '.join('.' + name for name in formats)}")
    if not path.parent.is_dir():
        raise PlotError(f"{option} {out}: the directory does not exist")
    return path


def engineering_axis(axis) -> None:
    """Tick labels like 2.5k, 100k, 1M: for counts and rates such as env steps."""
    from matplotlib.ticker import EngFormatter  # the optional `plot` extra

    axis.set_major_formatter(EngFormatter(sep=""))


def save(plt, fig, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
