"""The throughput-interactivity curve of the report: total tokens/s per GPU against tokens/s
per user at P50 and at P90, one point per decode batch, with the SLO lines and the plan's
operating point (its predicted metrics)."""

import itertools
import math

from compiler.plan import Plan
from targets._report_svg import Box, Labels, line, num, svg

WIDTH, HEIGHT = 720.0, 420.0
LEFT, RIGHT, TOP, BOTTOM = 78.0, 24.0, 44.0, 52.0
P50_COLOUR, P90_COLOUR, SLO_COLOUR, POINT_COLOUR = "#4C72B0", "#DD8452", "#C44E52", "#222222"
FONT_SIZE = 11.0


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
    p = plan.prediction
    pts = p.curve
    slo_x = [(c.field[-3:].upper(), c.target) for c in p.slo
             if c.field.startswith("slo.tokens_per_s_per_user_")]
    xs = [q.tokens_per_s_per_user_p50 for q in pts] + [q.tokens_per_s_per_user_p90 for q in pts]
    xs += [v for _, v in slo_x] + [p.tokens_per_s_per_user_p50, p.tokens_per_s_per_user_p90]
    ys = [q.total_tokens_per_s_per_gpu for q in pts] + [p.total_tokens_per_s_per_gpu, 0.0]
    span = max(xs) - min(xs) or max(xs) or 1.0  # the x axis starts near the data, not at 0
    xt, yt = nice_ticks(max(0.0, min(xs) - 0.15 * span), max(xs)), nice_ticks(0.0, max(ys))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(v: float) -> float:
        return LEFT + (v - x0) / (x1 - x0) * w

    def sy(v: float) -> float:
        return TOP + h - (v - y0) / (y1 - y0) * h

    body = [f'<rect x="{num(LEFT)}" y="{num(TOP)}" width="{num(w)}" height="{num(h)}" '
            'fill="#ffffff" stroke="#999999"/>']
    labels = Labels()
    for v in xt:
        body.append(line(sx(v), TOP, sx(v), TOP + h, "#eeeeee"))
        labels.place(sx(v), TOP + h + 18, _tick(v), FONT_SIZE, "middle")
    for v in yt:
        body.append(line(LEFT, sy(v), LEFT + w, sy(v), "#eeeeee"))
        labels.place(LEFT - 6, sy(v) + 4, _tick(v), FONT_SIZE, "end")
    labels.place(LEFT + w / 2, HEIGHT - 10, "tokens/s per user", FONT_SIZE, "middle")
    labels.place(4, TOP - 10, "total tokens/s per GPU", FONT_SIZE)
    for name, v in slo_x:
        body.append(line(sx(v), TOP, sx(v), TOP + h, SLO_COLOUR, stroke_width=1.5,
                         stroke_dasharray="6 3"))
        labels.avoid(Box(sx(v) - 1, TOP, 2, h))
        text = f"SLO {name} {v:g}"
        labels.first_free([(sx(v) + 4, TOP + 14, "start"), (sx(v) - 4, TOP + 14, "end"),
                           (sx(v) + 4, TOP + 28, "start"), (sx(v) - 4, TOP + 28, "end")],
                          text, FONT_SIZE, fill=SLO_COLOUR)
    for key, colour, dash in (("tokens_per_s_per_user_p50", P50_COLOUR, None),
                              ("tokens_per_s_per_user_p90", P90_COLOUR, "5 3")):
        coords = " ".join(f"{num(sx(getattr(q, key)))},{num(sy(q.total_tokens_per_s_per_gpu))}"
                          for q in pts)
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        body.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" '
                    f'stroke-width="2"{dashes}/>')
        xy = [(sx(getattr(q, key)), sy(q.total_tokens_per_s_per_gpu)) for q in pts]
        for (ax, ay), (bx, by) in itertools.pairwise(xy):  # labels keep off the lines too
            steps = max(1, math.ceil(math.hypot(bx - ax, by - ay) / 4))
            for k in range(steps + 1):
                t = k / steps
                labels.avoid(Box(ax + t * (bx - ax) - 1, ay + t * (by - ay) - 1, 2, 2))
        for q in pts:
            cx, cy = sx(getattr(q, key)), sy(q.total_tokens_per_s_per_gpu)
            body.append(f'<circle cx="{num(cx)}" cy="{num(cy)}" r="3" fill="{colour}">'
                        f"<title>batch {q.batch} per rank: {getattr(q, key):g} tokens/s per user "
                        f"({key[-3:].upper()}), {q.total_tokens_per_s_per_gpu:g} tokens/s per GPU"
                        "</title></circle>")
            labels.avoid(Box(cx - 3, cy - 3, 6, 6))
    op_y = sy(p.total_tokens_per_s_per_gpu)
    for key in ("tokens_per_s_per_user_p50", "tokens_per_s_per_user_p90"):
        cx = sx(getattr(p, key))
        body.append(f'<circle cx="{num(cx)}" cy="{num(op_y)}" r="7" fill="none" '
                    f'stroke="{POINT_COLOUR}" stroke-width="2"><title>operating point: '
                    f"{getattr(p, key):g} tokens/s per user ({key[-3:].upper()}), "
                    f"{p.total_tokens_per_s_per_gpu:g} tokens/s per GPU</title></circle>")
        labels.avoid(Box(cx - 7, op_y - 7, 14, 14))
    for q in pts:  # batch labels beside the P50 points, where they fit
        cx, cy = sx(q.tokens_per_s_per_user_p50), sy(q.total_tokens_per_s_per_gpu)
        labels.first_free([(cx + 6, cy - 5, "start"), (cx - 6, cy - 5, "end"),
                           (cx + 6, cy + 13, "start"), (cx - 6, cy + 13, "end")],
                          f"b{q.batch}", FONT_SIZE - 1, fill="#555555")
    op_x = sx(min(p.tokens_per_s_per_user_p50, p.tokens_per_s_per_user_p90))
    labels.first_free([(op_x - 10, op_y - 10, "end"), (op_x - 10, op_y + 18, "end"),
                       (sx(p.tokens_per_s_per_user_p50) + 10, op_y - 10, "start"),
                       (sx(p.tokens_per_s_per_user_p50) + 10, op_y + 18, "start")],
                      "operating point", FONT_SIZE, font_weight="bold")
    legend = [("P50", P50_COLOUR, None), ("P90", P90_COLOUR, "5 3")]
    legend += [("SLO", SLO_COLOUR, "6 3")] if slo_x else []
    x = WIDTH - RIGHT - 270
    for name, colour, dash in legend:
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        body.append(f'<line x1="{num(x)}" y1="{num(TOP - 14)}" x2="{num(x + 22)}" '
                    f'y2="{num(TOP - 14)}" stroke="{colour}" stroke-width="2"{dashes}/>')
        labels.place(x + 26, TOP - 10, name, FONT_SIZE)
        x += 62
    body.append(f'<circle cx="{num(x + 8)}" cy="{num(TOP - 14)}" r="6" fill="none" '
                f'stroke="{POINT_COLOUR}" stroke-width="2"/>')
    labels.place(x + 18, TOP - 10, "plan", FONT_SIZE)
    return svg(WIDTH, HEIGHT, body + labels.elements, "throughput against interactivity"), \
        labels.boxes
