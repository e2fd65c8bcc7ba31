"""The load over time against capacity, as an SVG picture (standard library only).

One picture per scenario: for each policy, the requests sent per second ÷ C (a line), and the
capacity (C = 1, dashed). Long runs are folded into at most :data:`MAX_POINTS` points per line,
each the highest of the seconds it covers, so no peak is lost.
"""

from __future__ import annotations

from html import escape
from typing import Sequence

from fsm.sim.metrics import Result

__all__ = ["MAX_POINTS", "load_svg"]

MAX_POINTS = 1200
_COLOURS = ("#000000", "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
            "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79")
_W, _H, _L, _R, _T, _B = 960, 420, 60, 190, 40, 40


def _series(result: Result, last: int) -> list[tuple[int, float]]:
    per_s = dict(result.sent_per_s)
    step = max(1, -(-(last + 1) // MAX_POINTS))
    out = []
    for start in range(0, last + 1, step):
        top = max(per_s.get(s, 0) for s in range(start, min(last + 1, start + step)))
        out.append((start, top / result.capacity))
    return out


def load_svg(scenario: str, text: str, results: Sequence[Result]) -> str:
    """The SVG text for ``scenario`` (``text``: its one-line description) and its runs."""
    last = max((r.sent_per_s[-1][0] for r in results if r.sent_per_s), default=1)
    series = [(r.policy, _series(r, last)) for r in results]
    top = max([1.0] + [y for _, pts in series for _, y in pts])
    top = float(int(top) + 1)
    pw, ph = _W - _L - _R, _H - _T - _B

    def x(s: float) -> float:
        return _L + pw * s / max(1, last)

    def y(v: float) -> float:
        return _T + ph * (1 - v / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
             f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="12">',
             f'<rect width="{_W}" height="{_H}" fill="white"/>',
             f'<text x="{_L}" y="18" font-size="14" font-weight="bold">{escape(scenario)}: requests '
             f'sent per second ÷ capacity C</text>',
             f'<text x="{_L}" y="33" fill="#555">{escape(text)}</text>']
    for k in range(int(top) + 1):
        parts.append(f'<line x1="{_L}" y1="{y(k):.1f}" x2="{_L + pw}" y2="{y(k):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{_L - 6}" y="{y(k) + 4:.1f}" text-anchor="end">{k}×</text>')
    ticks = 10
    for k in range(ticks + 1):
        s = last * k / ticks
        parts.append(f'<text x="{x(s):.1f}" y="{_T + ph + 16}" text-anchor="middle">{s:.0f} s</text>')
    parts.append(f'<line x1="{_L}" y1="{y(1):.1f}" x2="{_L + pw}" y2="{y(1):.1f}" stroke="#000" '
                 f'stroke-dasharray="6 4" stroke-width="1.5"/>')
    parts.append(f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    for n, (policy, pts) in enumerate(series):
        colour = _COLOURS[n % len(_COLOURS)]
        width = 2.2 if policy in ("ideal", "resilient") else 1.1
        path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in pts)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="{width}" '
                     f'points="{path}"><title>{escape(policy)}</title></polyline>')
        ly = _T + 14 + 16 * n
        parts.append(f'<line x1="{_L + pw + 12}" y1="{ly - 4}" x2="{_L + pw + 32}" y2="{ly - 4}" '
                     f'stroke="{colour}" stroke-width="{width + 1}"/>')
        parts.append(f'<text x="{_L + pw + 38}" y="{ly}">{escape(policy)}</text>')
    ly = _T + 14 + 16 * len(series)
    parts.append(f'<line x1="{_L + pw + 12}" y1="{ly - 4}" x2="{_L + pw + 32}" y2="{ly - 4}" '
                 f'stroke="#000" stroke-dasharray="6 4"/>')
    parts.append(f'<text x="{_L + pw + 38}" y="{ly}">capacity C</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
