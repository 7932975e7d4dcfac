"""The throughput-interactivity curve of the report: total tokens/s per GPU against tokens/s
per user at P50 and at P90, one point per decode batch, with the SLO lines and the plan's
operating point (its predicted metrics)."""

import itertools
import math

from compiler.plan import Plan, Predicted
from targets._report_svg import Box, Labels, line, num, svg

WIDTH, HEIGHT = 720.0, 420.0
LEFT, RIGHT, TOP, BOTTOM = 78.0, 24.0, 44.0, 52.0
P50_COLOUR, P90_COLOUR, SLO_COLOUR, POINT_COLOUR = "#4C72B0", "#DD8452", "#C44E52", "#222222"
FONT_SIZE = 11.0
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
SERIES = (("tokens_per_s_per_user_p50", P50_COLOUR, None),  # (tokens/s per user, colour, dash)
          ("tokens_per_s_per_user_p90", P90_COLOUR, "5 3"))


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    return [round(first + k * step, 10) for k in range(math.ceil((hi - first) / step) + 1)]


def _tick(v: float) -> str:
    if abs(v) >= 10_000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def curve_svg(plan: Plan) -> tuple[str, list[Box]]:
    """The SVG and the boxes of every label it writes."""
    curve = _Curve(plan.prediction)
    curve.grid()
    curve.slo_lines()
    for key, colour, dash in SERIES:
        curve.series(key, colour, dash)
    curve.operating_point()
    curve.batch_labels()
    curve.operating_point_label()
    curve.legend()
    return svg(WIDTH, HEIGHT, curve.body + curve.labels.elements,
               "throughput against interactivity"), curve.labels.boxes


def _ticks(p: Predicted, slo_x: list[float]) -> tuple[list[float], list[float]]:
    """The x and y ticks: every point, SLO line and the operating point within them."""
    pts = p.curve
    xs = [q.tokens_per_s_per_user_p50 for q in pts] + [q.tokens_per_s_per_user_p90 for q in pts]
    xs += [*slo_x, p.tokens_per_s_per_user_p50, p.tokens_per_s_per_user_p90]
    ys = [q.total_tokens_per_s_per_gpu for q in pts] + [p.total_tokens_per_s_per_gpu, 0.0]
    span = max(xs) - min(xs) or max(xs) or 1.0  # the x axis starts near the data, not at 0
    return nice_ticks(max(0.0, min(xs) - 0.15 * span), max(xs)), nice_ticks(0.0, max(ys))


class _Curve:
    """One curve drawing under way: its scales, its elements so far and its labels. A label
    keeps the first free spot, so the order of the steps decides which label yields."""

    def __init__(self, p: Predicted) -> None:
        self.p = p
        self.slo_x = [(c.field[-3:].upper(), c.target) for c in p.slo
                      if c.field.startswith("slo.tokens_per_s_per_user_")]
        self.xt, self.yt = _ticks(p, [v for _, v in self.slo_x])
        self.body: list[str] = []
        self.labels = Labels()

    def sx(self, v: float) -> float:
        x0, x1 = self.xt[0], self.xt[-1]
        return LEFT + (v - x0) / (x1 - x0) * PLOT_W

    def sy(self, v: float) -> float:
        y0, y1 = self.yt[0], self.yt[-1]
        return TOP + PLOT_H - (v - y0) / (y1 - y0) * PLOT_H

    def grid(self) -> None:
        self.body.append(f'<rect x="{num(LEFT)}" y="{num(TOP)}" width="{num(PLOT_W)}" '
                         f'height="{num(PLOT_H)}" fill="#ffffff" stroke="#999999"/>')
        for v in self.xt:
            self.body.append(line(self.sx(v), TOP, self.sx(v), TOP + PLOT_H, "#eeeeee"))
            self.labels.place(self.sx(v), TOP + PLOT_H + 18, _tick(v), FONT_SIZE, "middle")
        for v in self.yt:
            self.body.append(line(LEFT, self.sy(v), LEFT + PLOT_W, self.sy(v), "#eeeeee"))
            self.labels.place(LEFT - 6, self.sy(v) + 4, _tick(v), FONT_SIZE, "end")
        self.labels.place(LEFT + PLOT_W / 2, HEIGHT - 10, "tokens/s per user", FONT_SIZE,
                          "middle")
        self.labels.place(4, TOP - 10, "total tokens/s per GPU", FONT_SIZE)

    def slo_lines(self) -> None:
        for name, v in self.slo_x:
            x = self.sx(v)
            self.body.append(line(x, TOP, x, TOP + PLOT_H, SLO_COLOUR, stroke_width=1.5,
                                  stroke_dasharray="6 3"))
            self.labels.avoid(Box(x - 1, TOP, 2, PLOT_H))
            self.labels.first_free([(x + 4, TOP + 14, "start"), (x - 4, TOP + 14, "end"),
                                    (x + 4, TOP + 28, "start"), (x - 4, TOP + 28, "end")],
                                   f"SLO {name} {v:g}", FONT_SIZE, fill=SLO_COLOUR)

    def series(self, key: str, colour: str, dash: str | None) -> None:
        """One percentile's line and points; `key` names its tokens/s per user."""
        pts = self.p.curve
        xy = [(self.sx(getattr(q, key)), self.sy(q.total_tokens_per_s_per_gpu)) for q in pts]
        coords = " ".join(f"{num(x)},{num(y)}" for x, y in xy)
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        self.body.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" '
                         f'stroke-width="2"{dashes}/>')
        self._avoid_polyline(xy)
        for q, (cx, cy) in zip(pts, xy, strict=True):
            self.body.append(
                f'<circle cx="{num(cx)}" cy="{num(cy)}" r="3" fill="{colour}">'
                f"<title>batch {q.batch} per rank: {getattr(q, key):g} tokens/s per user "
                f"({key[-3:].upper()}), {q.total_tokens_per_s_per_gpu:g} tokens/s per GPU"
                "</title></circle>")
            self.labels.avoid(Box(cx - 3, cy - 3, 6, 6))

    def _avoid_polyline(self, xy: list[tuple[float, float]]) -> None:
        """Labels keep off the lines too: a small box every 4 units along each segment."""
        for (ax, ay), (bx, by) in itertools.pairwise(xy):
            steps = max(1, math.ceil(math.hypot(bx - ax, by - ay) / 4))
            for k in range(steps + 1):
                t = k / steps
                self.labels.avoid(Box(ax + t * (bx - ax) - 1, ay + t * (by - ay) - 1, 2, 2))

    def operating_point(self) -> None:
        p, op_y = self.p, self.sy(self.p.total_tokens_per_s_per_gpu)
        for key, _, _ in SERIES:
            cx = self.sx(getattr(p, key))
            self.body.append(
                f'<circle cx="{num(cx)}" cy="{num(op_y)}" r="7" fill="none" '
                f'stroke="{POINT_COLOUR}" stroke-width="2"><title>operating point: '
                f"{getattr(p, key):g} tokens/s per user ({key[-3:].upper()}), "
                f"{p.total_tokens_per_s_per_gpu:g} tokens/s per GPU</title></circle>")
            self.labels.avoid(Box(cx - 7, op_y - 7, 14, 14))

    def batch_labels(self) -> None:
        """Batch labels beside the P50 points, where they fit."""
        for q in self.p.curve:
            cx, cy = self.sx(q.tokens_per_s_per_user_p50), self.sy(q.total_tokens_per_s_per_gpu)
            self.labels.first_free([(cx + 6, cy - 5, "start"), (cx - 6, cy - 5, "end"),
                                    (cx + 6, cy + 13, "start"), (cx - 6, cy + 13, "end")],
                                   f"b{q.batch}", FONT_SIZE - 1, fill="#555555")

    def operating_point_label(self) -> None:
        p = self.p
        op_y = self.sy(p.total_tokens_per_s_per_gpu)
        op_x = self.sx(min(p.tokens_per_s_per_user_p50, p.tokens_per_s_per_user_p90))
        p50_x = self.sx(p.tokens_per_s_per_user_p50)
        self.labels.first_free([(op_x - 10, op_y - 10, "end"), (op_x - 10, op_y + 18, "end"),
                                (p50_x + 10, op_y - 10, "start"), (p50_x + 10, op_y + 18, "start")],
                               "operating point", FONT_SIZE, font_weight="bold")

    def legend(self) -> None:
        legend = [("P50", P50_COLOUR, None), ("P90", P90_COLOUR, "5 3")]
        legend += [("SLO", SLO_COLOUR, "6 3")] if self.slo_x else []
        x = WIDTH - RIGHT - 270
        for name, colour, dash in legend:
            dashes = f' stroke-dasharray="{dash}"' if dash else ""
            self.body.append(f'<line x1="{num(x)}" y1="{num(TOP - 14)}" x2="{num(x + 22)}" '
                             f'y2="{num(TOP - 14)}" stroke="{colour}" stroke-width="2"{dashes}/>')
            self.labels.place(x + 26, TOP - 10, name, FONT_SIZE)
            x += 62
        self.body.append(f'<circle cx="{num(x + 8)}" cy="{num(TOP - 14)}" r="6" fill="none" '
                         f'stroke="{POINT_COLOUR}" stroke-width="2"/>')
        self.labels.place(x + 18, TOP - 10, "plan", FONT_SIZE)
