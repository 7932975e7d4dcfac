"""Memory per die and per tray as stacked bars: what fills each memory domain's HBM (and each
tray's host memory), one bar per distinct budget, so that a rack of identical dies is one bar
with its count rather than hundreds."""

from compiler.ids import gpu_of_domain
from compiler.plan import Plan
from targets._report_svg import CHAR_EM, Box, Labels, rect, svg

DIE_PARTS = (("weights_gib", "weights", "#4C72B0"), ("kv_gib", "KV cache", "#DD8452"),
             ("engram_gib", "Engram", "#55A868"), ("pool_gib", "Mooncake pool", "#8172B3"),
             ("workspace_gib", "workspace", "#937860"),
             ("reserved_gib", "reserved (CUDA, NCCL, NIXL)", "#8C8C8C"))
HOST_PARTS = (("pool_gib", "Mooncake pool", "#8172B3"), ("engram_gib", "Engram", "#55A868"),
              ("weights_gib", "offloaded weights", "#4C72B0"),
              ("process_gib", "engine processes", "#937860"),
              ("reserved_gib", "reserved (kubelet, DaemonSets)", "#8C8C8C"))
FREE = "#F2F2F2"
LABEL_W, BAR_W, ROW, FONT = 330.0, 520.0, 24.0, 11.0
MAX_IDS = 3


def _rows(items: dict, parts: tuple, owner) -> list[tuple[tuple, list[str], set[str]]]:
    """(budget, ids, owners) per distinct budget, in the order first seen."""
    rows: dict[tuple, tuple[list[str], set[str]]] = {}
    for key, m in items.items():
        budget = (*(getattr(m, f) for f, _, _ in parts), m.capacity_gib)
        ids, owners = rows.setdefault(budget, ([], set()))
        ids.append(key)
        owners.add(owner(key))
    return [(b, ids, owners) for b, (ids, owners) in rows.items()]


def _bars(rows, parts: tuple, what: str) -> tuple[str, list[Box]]:
    labels = Labels()
    body = []
    scale = BAR_W / max(b[-1] for b, _, _ in rows)
    for k, (budget, ids, owners) in enumerate(rows):
        y = k * ROW
        shown = ", ".join(ids[:MAX_IDS]) + (f" +{len(ids) - MAX_IDS}" if len(ids) > MAX_IDS
                                            else "")
        x = LABEL_W
        capacity = budget[-1]
        named = sorted(o for o in owners if o)
        who = ", ".join(named[:MAX_IDS]) + (f" +{len(named) - MAX_IDS}"
                                            if len(named) > MAX_IDS else "") or "idle"
        label = (f"{len(ids)} x {ids[0]}" if len(ids) > 1 else ids[0]) + f" ({who})"
        room = int((LABEL_W - 8) / (FONT * CHAR_EM))
        labels.place(0, y + 15, label if len(label) <= room else label[:room - 1] + "…", FONT)
        for (_, name, colour), gib in zip(parts, budget[:-1], strict=True):
            if gib > 0:
                body.append(rect(x, y + 3, gib * scale, ROW - 6, colour,
                                 f"{name}: {gib:g} GiB of {capacity:g} ({what} {shown}; {who})"))
                x += gib * scale
        free = capacity - sum(budget[:-1])
        body.append(rect(x, y + 3, max(free, 0.0) * scale, ROW - 6, FREE,
                         f"free: {free:.1f} GiB of {capacity:g} ({what} {shown}; {who})",
                         stroke="#cccccc", stroke_width=0.5))
        labels.place(LABEL_W + capacity * scale + 6, y + 15,
                     f"{capacity - free:.1f}/{capacity:g} GiB", FONT)
    width = LABEL_W + BAR_W + 120
    return svg(width, len(rows) * ROW, body + labels.elements, f"memory per {what}"), \
        labels.boxes


def die_svg(plan: Plan) -> tuple[str, list[Box]]:
    owner = {g: i.id for i in plan.instances for g in i.gpus}
    rows = _rows(plan.memory, DIE_PARTS, lambda d: owner.get(gpu_of_domain(d), ""))
    return _bars(rows, DIE_PARTS, "memory domain")


def host_svg(plan: Plan) -> tuple[str, list[Box]] | None:
    if not plan.host_memory:
        return None
    on_tray: dict[str, set[str]] = {}
    for i in plan.instances:
        for t in i.trays:
            on_tray.setdefault(t, set()).add(i.id)
    rows = _rows(plan.host_memory, HOST_PARTS, lambda t: ", ".join(sorted(on_tray.get(t, ()))))
    return _bars(rows, HOST_PARTS, "tray")


def legend_html(parts: tuple) -> str:
    items = [f'<li><span class="swatch" style="background:{c}"></span>{n}</li>'
             for _, n, c in parts]
    items.append(f'<li><span class="swatch" style="background:{FREE}"></span>free</li>')
    return '<ul class="legend">' + "".join(items) + "</ul>"
