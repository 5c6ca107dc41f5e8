"""The flicker chart of one pass on the shot page: an inline SVG drawn here, so the page needs
no script and nothing from a CDN (its Content-Security-Policy allows neither). Scores are
drawn as a line over the frames, the threshold as a dashed line, and each flagged frame as a
red dot that links to its preview."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup, escape

WIDTH, HEIGHT = 720, 150
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 10, 24  # margins for the axis labels


# one colour per version, oldest first: the per-frame version blue, a stabilised one green
_COLOURS = ("#4a7fb5", "#2e8b57", "#b5834a", "#7a4ab5")


def flicker_chart(
    name: str, versions: Mapping[str, Sequence[Mapping[str, Any]]], threshold: float
) -> Markup:
    """SVG of each version's ``scores`` (frame, flicker, flagged, preview_id; ordered by
    frame), one line per version (in the order given, with a legend when there are two or
    more): a stabilised version is read against the one it came from."""
    drawn = {version: scores for version, scores in versions.items() if scores}
    if not drawn:
        return Markup("")
    frames = [int(s["frame"]) for scores in drawn.values() for s in scores]
    values = [float(s["flicker"]) for scores in drawn.values() for s in scores]
    first, last = min(frames), max(frames)
    top = max(max(values), threshold) * 1.1
    span = max(last - first, 1)

    def x(frame: int) -> float:
        return LEFT + (frame - first) * (WIDTH - LEFT - RIGHT) / span

    def y(value: float) -> float:
        return HEIGHT - BOTTOM - value * (HEIGHT - TOP - BOTTOM) / top

    title = f"{name}: flicker score per frame (threshold {threshold:g})"
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        _axes(first, last, top, threshold, x, y),
    ]
    for index, (version, scores) in enumerate(drawn.items()):
        colour = _COLOURS[index % len(_COLOURS)]
        parts += _line(version, scores, colour, x, y)
        if len(drawn) > 1:
            parts.append(_text(WIDTH - RIGHT, TOP + 10 + 12 * index, version, "end", colour))
    parts.append("</svg>")
    return Markup("".join(parts))


def _line(
    version: str, scores: Sequence[Mapping[str, Any]], colour: str, x: Any, y: Any
) -> list[str]:
    points = " ".join(f"{x(int(s['frame'])):.1f},{y(float(s['flicker'])):.1f}" for s in scores)
    parts = [
        f'<polyline class="score" data-version="{escape(version)}" fill="none" '
        f'stroke="{colour}" stroke-width="1.5" points="{points}"/>'
    ]
    for score in scores:
        frame, value = int(score["frame"]), float(score["flicker"])
        label = escape(f"{version} frame {frame}: {value:g}")
        if not score["flagged"]:
            parts.append(
                f'<circle class="frame" cx="{x(frame):.1f}" cy="{y(value):.1f}" r="2" '
                f'fill="{colour}"><title>{label}</title></circle>'
            )
            continue
        dot = (
            f'<circle class="flagged" data-frame="{frame}" cx="{x(frame):.1f}" '
            f'cy="{y(value):.1f}" r="4.5" fill="#c0392b"><title>{label} (flagged)</title></circle>'
        )
        if score.get("preview_id") is not None:
            dot = f'<a href="/files/outputs/{int(score["preview_id"])}">{dot}</a>'
        parts.append(dot)
    return parts


def _axes(first: int, last: int, top: float, threshold: float, x: Any, y: Any) -> str:
    left, right, bottom = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM
    return "".join(
        [
            f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#999"/>',
            f'<line x1="{left}" y1="{TOP}" x2="{left}" y2="{bottom}" stroke="#999"/>',
            f'<line class="threshold" x1="{left}" y1="{y(threshold):.1f}" x2="{right}" '
            f'y2="{y(threshold):.1f}" stroke="#c0392b" stroke-dasharray="4 3"/>',
            _text(left - 4, y(threshold) + 4, f"{threshold:g}", "end"),
            _text(left - 4, bottom, "0", "end"),
            _text(left - 4, TOP + 8, f"{top:.3g}", "end"),
            _text(x(first), HEIGHT - 6, str(first), "start"),
            _text(x(last), HEIGHT - 6, str(last), "end"),
            _text((left + right) / 2, HEIGHT - 6, "frame", "middle"),
        ]
    )


def _text(x: float, y: float, text: str, anchor: str, colour: str = "#555") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="10" fill="{colour}" '
        f'text-anchor="{anchor}">{escape(text)}</text>'
    )
