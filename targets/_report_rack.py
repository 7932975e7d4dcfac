"""The rack map of the report: one panel per NVLink rack (HGX: per 16 nodes), trays as rows,
GPUs as columns split into their memory domains, coloured by the role of the instance on
them; a dot marks a domain holding Engram shards, a violet stripe its HBM pool segment, the
bar at a tray's right end its Mooncake DRAM segment. Hovering a GPU or a tray shows what it
holds (SVG `<title>`). Small fleets are drawn large with tray ids and instance ids; large
ones compact, with only the panel titles."""

from dataclasses import dataclass
from html import escape

from compiler.ids import domain_id, gpu_of_domain
from compiler.plan import DomainMemory, Hardware, Instance, Plan, Tray
from targets._report_svg import CHAR_EM, Box, Labels, rect, svg

ROLE_COLOURS = {"prefill": ("#4C72B0", "#6F8FC7"), "decode": ("#DD8452", "#E8A57A"),
                "aggregated": ("#55A868", "#7DC08C")}  # two shades: neighbours stand apart
IDLE, DOWN, POOL, ENGRAM = "#E5E5E5", "#333333", "#8172B3", "#FFFFFF"
HGX_NODES_PER_PANEL = 16
MAX_WIDTH = 1160.0
DETAILED_PANELS = 4  # up to this many panels: large cells, tray and instance ids


@dataclass(frozen=True)
class Scale:
    gpu: float  # width of one GPU (its memory domains share it)
    row: float  # height of one tray
    tray_label: float  # room left of a panel for tray ids (0: none)
    font: float
    pool_bar: float


DETAILED = Scale(gpu=64.0, row=22.0, tray_label=58.0, font=10.0, pool_bar=10.0)
COMPACT = Scale(gpu=14.0, row=7.0, tray_label=0.0, font=9.0, pool_bar=4.0)
GAP, TITLE = 14.0, 16.0


def panels(plan: Plan) -> list[tuple[str, Hardware, list[Tray]]]:
    """(title, hardware, trays) per panel: one per NVLink rack; HGX nodes in runs of 16 (a
    mixed fleet: each group's panels in turn)."""
    out = []
    for hw in plan.fleet:
        trays = hw.trays
        if hw.form == "hgx":
            n = HGX_NODES_PER_PANEL
            out += [(f"{trays[k].id}..{trays[min(k + n, len(trays)) - 1].id.split('-')[-1]}",
                     hw, trays[k:k + n]) for k in range(0, len(trays), n)]
            continue
        by_domain: dict[str, list[Tray]] = {}
        for t in trays:
            by_domain.setdefault(t.nvlink_domain, []).append(t)
        out += [(f"{d} ({ts[0].id.split('-')[0]})", hw, ts) for d, ts in by_domain.items()]
    return out


def _gpu_title(gpu: str, inst: Instance | None, rank: int, down: bool,
               domains: list[tuple[str, DomainMemory]], shards: dict[str, list]) -> str:
    head = f"{gpu}: unavailable" if down else \
        f"{gpu}: {inst.id} ({inst.role} {inst.shape}, rank {rank})" if inst else f"{gpu}: idle"
    lines = [head]
    for d, m in domains:
        used = (m.weights_gib + m.kv_gib + m.engram_gib + m.pool_gib + m.workspace_gib
                + m.reserved_gib)
        here = shards.get(d, [])
        engram = f", Engram {m.engram_gib:g} ({len(here)} shards)" if here else ""
        pool = f", pool {m.pool_gib:g}" if m.pool_gib else ""
        lines.append(f"{d}: weights {m.weights_gib:g}, KV {m.kv_gib:g}{engram}{pool}, "
                     f"workspace {m.workspace_gib:g}, reserved {m.reserved_gib:g}; "
                     f"{used:.1f} of {m.capacity_gib:g} GiB")
    return "\n".join(lines)


def rack_svg(plan: Plan) -> tuple[str, list[Box]]:
    """The SVG and the boxes of every label it writes."""
    groups = panels(plan)
    scale = DETAILED if len(groups) <= DETAILED_PANELS else COMPACT
    panel_w, panel_h, cols = _panel_grid(groups, scale)
    rack = _RackMap(plan, scale)
    for k, (title, hw, trays) in enumerate(groups):
        rack.panel((k % cols) * (panel_w + GAP), (k // cols) * (panel_h + GAP), title, hw, trays)
    height = (len(groups) + cols - 1) // cols * (panel_h + GAP)
    width = cols * (panel_w + GAP) - GAP
    return svg(width, height, rack.body + rack.labels.elements, "rack map"), rack.labels.boxes


def _panel_grid(groups: list[tuple[str, Hardware, list[Tray]]], scale: Scale
                ) -> tuple[float, float, int]:
    """The width and height of every panel (those of the largest) and the panels per row."""
    widths = [scale.tray_label + hw.gpus_per_tray * scale.gpu + 2 + scale.pool_bar
              for _, hw, _ in groups]
    panel_w = max(max(widths), max(len(t) for t, _, _ in groups) * scale.font * CHAR_EM + 2)
    cols = max(1, min(len(groups), int((MAX_WIDTH + GAP) // (panel_w + GAP))))
    panel_h = TITLE + max(len(ts) for _, _, ts in groups) * scale.row
    return panel_w, panel_h, cols


class _RackMap:
    """The rack map under way: what each GPU, memory domain and tray holds, the elements
    written so far and the labels."""

    def __init__(self, plan: Plan, scale: Scale) -> None:
        self.plan, self.scale = plan, scale
        self.inst_of = {g: (i, r) for i in plan.instances for r, g in enumerate(i.gpus)}
        self.shade: dict[str, int] = {}  # in the order the map meets them, so neighbours alternate
        self.down = set(plan.hardware.unavailable_gpus)
        self.mem: dict[str, list[tuple[str, DomainMemory]]] = {}
        for dom_id, m in plan.memory.items():
            self.mem.setdefault(gpu_of_domain(dom_id), []).append((dom_id, m))
        self.shards: dict[str, list] = {}
        for s in plan.engram_shards:
            self.shards.setdefault(s.domain, []).append(s)
        self.hbm_pool = {s.location for s in plan.kv_pool.segments if s.kind == "hbm"}
        self.dram_pool = {s.location: s.gib for s in plan.kv_pool.segments if s.kind == "dram"}
        self.body: list[str] = []
        self.labels = Labels()

    def panel(self, px: float, py: float, title: str, hw: Hardware, trays: list[Tray]) -> None:
        scale = self.scale
        self.labels.place(px, py + TITLE - 4, title, scale.font, font_weight="bold")
        gx = px + scale.tray_label
        for r, tray in enumerate(trays):
            ty = py + TITLE + r * scale.row
            if scale.tray_label:
                self.labels.place(gx - 4, ty + scale.row * 0.7, tray.id, scale.font, "end")
            for c in range(len(tray.gpus)):
                self.gpu(gx + c * scale.gpu, ty, hw, tray, c)
            if tray.id in self.dram_pool:
                self.dram_bar(gx + hw.gpus_per_tray * scale.gpu + 1, ty, tray)

    def gpu(self, x: float, ty: float, hw: Hardware, tray: Tray, c: int) -> None:
        """The `c`th GPU of a tray's row, at (x, ty), with its hover text and instance id."""
        scale, gpu = self.scale, tray.gpus[c]
        inst, rank = self.inst_of.get(gpu, (None, 0))
        if inst:
            self.shade.setdefault(inst.id, len(self.shade) % 2)
        fill = DOWN if gpu in self.down else \
            ROLE_COLOURS[inst.role][self.shade[inst.id]] if inst else IDLE
        cells = [rect(x, ty, scale.gpu - 1, scale.row - 1, fill),
                 *self.domain_marks(gpu, x, ty, hw.domains_per_gpu)]
        title = _gpu_title(gpu, inst, rank, gpu in self.down, self.mem.get(gpu, []), self.shards)
        self.body.append("<g><title>" + escape(title) + "</title>" + "".join(cells) + "</g>")
        if inst and rank == 0 and scale.tray_label:
            run = _run(tray.gpus, c, inst) * scale.gpu  # its own GPUs in this row
            if len(inst.id) * scale.font * CHAR_EM + 6 <= run:
                self.labels.place(x + 3, ty + scale.row * 0.7, inst.id, scale.font,
                                  fill="#ffffff")

    def domain_marks(self, gpu: str, x: float, ty: float, per_gpu: int) -> list[str]:
        """A GPU's memory domains: a white line between two, the HBM pool's stripe, the dot
        of Engram shards."""
        row, cell = self.scale.row, self.scale.gpu / per_gpu
        marks = []
        for d in range(per_gpu):
            dom, dx = domain_id(gpu, d), x + d * cell
            if d:
                marks.append(rect(dx - 0.5, ty, 0.5, row - 1, "#ffffff"))
            if dom in self.hbm_pool:
                marks.append(rect(dx, ty + row - 1 - row / 5, cell - 1, row / 5, POOL))
            if dom in self.shards:  # top right, clear of the instance labels
                dot = min(row, cell) / 8
                marks.append(f'<circle cx="{dx + cell - 2 * dot - 1:.2f}" '
                             f'cy="{ty + 2 * dot:.2f}" r="{dot:.2f}" fill="{ENGRAM}"/>')
        return marks

    def dram_bar(self, bx: float, ty: float, tray: Tray) -> None:
        host = self.plan.host_memory.get(tray.id)
        cap = f" of {host.capacity_gib:g} GiB host memory" if host else ""
        self.body.append(rect(bx, ty, self.scale.pool_bar, self.scale.row - 1, POOL,
                              f"{tray.id} ({tray.node_name}): Mooncake DRAM segment "
                              f"{self.dram_pool[tray.id]:g} GiB{cap}"))


def _run(gpus: list[str], start: int, inst: Instance) -> int:
    """How many GPUs from `start` on, in a row of one tray, belong to `inst`."""
    own, n = set(inst.gpus), 0
    while start + n < len(gpus) and gpus[start + n] in own:
        n += 1
    return n


def legend_html(plan: Plan) -> str:
    """The rack map's legend, as HTML swatches."""
    roles = sorted({i.role for i in plan.instances})
    items = [(ROLE_COLOURS[r][0], f"{r} instance (alternate shades: neighbouring instances)")
             for r in roles]
    items += [(IDLE, "idle GPU"), (DOWN, "unavailable GPU")]
    if plan.engram_shards:
        items.append(("engram", "Engram shards in this memory domain"))
    if any(s.kind == "hbm" for s in plan.kv_pool.segments):
        items.append(("hbm", "Mooncake pool segment in HBM"))
    if any(s.kind == "dram" for s in plan.kv_pool.segments):
        items.append((POOL, "Mooncake pool segment in the tray's DRAM (bar at the row's end)"))
    if any(hw.domains_per_gpu > 1 for hw in plan.fleet):
        items.append(("domains", "a GPU split into its memory domains (white line)"))
    out = []
    for swatch, text in items:
        if swatch == "engram":
            mark = '<span class="swatch" style="background:#888"><i class="dot"></i></span>'
        elif swatch == "hbm":
            mark = '<span class="swatch" style="background:#DD8452"><i class="stripe"></i></span>'
        elif swatch == "domains":
            mark = '<span class="swatch split"></span>'
        else:
            mark = f'<span class="swatch" style="background:{swatch}"></span>'
        out.append(f"<li>{mark}{text}</li>")
    return '<ul class="legend">' + "".join(out) + "</ul>"
