"""SVG building blocks of the HTML report: escaped elements, text boxes and label placement.

Labels are set in a monospace font so that their boxes are known without a renderer: a
character is `CHAR_EM` em wide and a line `LINE_EM` em high. Every label a drawing writes goes
through `Labels`, which refuses one that would overlap another, so no two labels overlap
whatever the plan's size (tests check the boxes here and in a real browser).
"""

from dataclasses import dataclass
from html import escape

FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"
CHAR_EM = 0.62  # advance of one character of the monospace fonts above, in em (DejaVu: 0.602)
LINE_EM = 1.2


@dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float

    def overlaps(self, other: "Box") -> bool:
        return (self.x < other.x + other.w and other.x < self.x + self.w
                and self.y < other.y + other.h and other.y < self.y + self.h)


def text_box(x: float, y: float, text: str, size: float, anchor: str = "start") -> Box:
    """The box of `text` drawn at (x, y) (y: the baseline) with `text-anchor` `anchor`."""
    w = len(text) * size * CHAR_EM
    left = {"start": x, "middle": x - w / 2, "end": x - w}[anchor]
    return Box(left, y - size * 0.9, w, size * LINE_EM)


def num(v: float) -> str:
    """A coordinate: two decimals at most, no trailing zeros (stable output)."""
    return f"{v:.2f}".rstrip("0").rstrip(".")


def attrs(**kw: object) -> str:
    return "".join(f' {k.rstrip("_").replace("_", "-")}="{_value(v)}"'
                   for k, v in kw.items() if v is not None)


def _value(v: object) -> str:
    return num(v) if isinstance(v, float) else escape(str(v))


def rect(x: float, y: float, w: float, h: float, fill: str, title: str | None = None,
         **kw: object) -> str:
    body = attrs(x=float(x), y=float(y), width=float(w), height=float(h), fill=fill, **kw)
    if title is None:
        return f"<rect{body}/>"
    return f"<rect{body}><title>{escape(title)}</title></rect>"


def line(x1: float, y1: float, x2: float, y2: float, stroke: str, **kw: object) -> str:
    ends = attrs(x1=float(x1), y1=float(y1), x2=float(x2), y2=float(y2))
    return f"<line{ends}{attrs(stroke=stroke, **kw)}/>"


def svg(width: float, height: float, body: list[str], label: str) -> str:
    size = attrs(width=float(width), height=float(height))
    return (f'<svg xmlns="http://www.w3.org/2000/svg"{size}'
            f' viewBox="0 0 {num(width)} {num(height)}" role="img"{attrs(aria_label=label)}'
            f' font-family="{FONT}">' + "".join(body) + "</svg>")


class Labels:
    """The labels of one drawing: `place` writes a label only where it overlaps none so far."""

    def __init__(self) -> None:
        self.boxes: list[Box] = []  # the labels written
        self.obstacles: list[Box] = []  # marks the labels keep off
        self.elements: list[str] = []

    def avoid(self, box: Box) -> None:
        self.obstacles.append(box)

    def free(self, box: Box) -> bool:
        return not any(box.overlaps(b) for b in self.boxes) \
            and not any(box.overlaps(b) for b in self.obstacles)

    def place(self, x: float, y: float, text: str, size: float, anchor: str = "start",
              **kw: object) -> bool:
        box = text_box(x, y, text, size, anchor)
        if not self.free(box):
            return False
        self.boxes.append(box)
        where = attrs(x=float(x), y=float(y), font_size=float(size),
                      text_anchor=anchor if anchor != "start" else None, **kw)
        self.elements.append(f"<text{where}>{escape(text)}</text>")
        return True

    def first_free(self, spots: list[tuple[float, float, str]], text: str, size: float,
                   **kw: object) -> bool:
        """Write the label at the first of `spots` (x, y, anchor) where it fits."""
        return any(self.place(x, y, text, size, anchor, **kw) for x, y, anchor in spots)
