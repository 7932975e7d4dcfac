"""The plan's ids, in one place: racks `r3`, trays `r3-t07`, GPUs `r3-t07-g2`, memory domains
`r3-t07-g2-d1`, NVLink domains `nvl3` and instances `prefill-03`; how each is written, read
back and ordered (numbers as numbers, so `r2` comes before `r10`).

A mixed fleet numbers racks, NVLink domains and instances on across its groups in order; each
group is built and lowered with the `Offsets` of the groups before it, so an id, once made,
names the same thing in the group's plan and in the fleet's (nothing is renamed afterwards).
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

ROLES = ("prefill", "decode", "aggregated")
_GPU = re.compile(r"^r(\d+)-t(\d+)-g(\d+)$")
_TRAY = re.compile(r"^r(\d+)-t(\d+)$")
_PART = re.compile(r"^r(\d+)(?:-t(\d+)(?:-g(\d+))?)?$")
_INSTANCE = re.compile(r"^(prefill|decode|aggregated)-(\d{1,9})$")
_DIGITS = re.compile(r"(\d+)")


class TrayId(NamedTuple):
    rack: int
    tray: int  # within its rack

    def __str__(self) -> str:
        return f"r{self.rack}-t{self.tray:02d}"


class GpuId(NamedTuple):
    rack: int
    tray: int
    gpu: int  # within its tray

    def __str__(self) -> str:
        return f"{TrayId(self.rack, self.tray)}-g{self.gpu}"


class InstanceId(NamedTuple):
    role: str
    number: int

    def __str__(self) -> str:
        return f"{self.role}-{self.number:02d}"


def rack_id(rack: int) -> str:
    return f"r{rack}"


def tray_id(rack: int, tray: int) -> str:
    return str(TrayId(rack, tray))


def gpu_id(rack: int, tray: int, gpu: int) -> str:
    return str(GpuId(rack, tray, gpu))


def domain_id(gpu: str, domain: int) -> str:
    return f"{gpu}-d{domain}"


def nvlink_id(index: int) -> str:
    return f"nvl{index}"


def instance_id(role: str, number: int) -> str:
    return str(InstanceId(role, number))


def tray_of_gpu(gpu: str) -> str:
    """`r0-t07` of `r0-t07-g2`."""
    return gpu.rsplit("-g", 1)[0]


def gpu_of_domain(domain: str) -> str:
    """`r0-t07-g2` of `r0-t07-g2-d1`."""
    return domain.rsplit("-d", 1)[0]


def parse_gpu(text: str) -> GpuId | None:
    m = _GPU.match(text)
    return GpuId(int(m[1]), int(m[2]), int(m[3])) if m else None


def parse_tray(text: str) -> TrayId | None:
    m = _TRAY.match(text)
    return TrayId(int(m[1]), int(m[2])) if m else None


def parse_part(text: str) -> tuple[int, int | None, int | None] | None:
    """(rack, tray, GPU) of a rack `r3`, a tray `r3-t07` or a GPU `r3-t07-g2` (None for the
    parts it does not name); None when it is none of them."""
    m = _PART.match(text)
    if not m:
        return None
    r, t, g = m.groups()
    return int(r), None if t is None else int(t), None if g is None else int(g)


def parse_instance(text: str) -> InstanceId | None:
    m = _INSTANCE.match(text)
    return InstanceId(m[1], int(m[2])) if m else None


def natural(text: str) -> list:
    """The order of ids: their runs of digits compared as numbers (`r2-t03` < `r10-t00`,
    `prefill-9` < `prefill-10`). The parts alternate text and number, so any two ids compare."""
    return [int(p) if p.isdigit() else p for p in _DIGITS.split(text)]


@dataclass(frozen=True)
class Offsets:
    """Where a group's rack and NVLink domain ids start in its fleet: the counts of the groups
    before it. A one-system deployment starts at zero."""

    racks: int = 0
    nvlinks: int = 0

    def after(self, racks: int, nvlinks: int) -> "Offsets":
        """The next group's, after one of these many racks and NVLink domains."""
        return Offsets(self.racks + racks, self.nvlinks + nvlinks)


def next_numbers(instances: Iterable[str], numbers: dict[str, int] | None = None
                 ) -> dict[str, int]:
    """Per role, the first instance number none of `instances` (nor `numbers`) uses: where
    the next plan of a fleet (or of a recompile) numbers its new instances from."""
    out = dict(numbers or {})
    for text in instances:
        iid = parse_instance(text)
        if iid is not None:
            out[iid.role] = max(out.get(iid.role, 0), iid.number + 1)
    return out
