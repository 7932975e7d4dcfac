"""The public entry points the CLI calls: each takes paths/inputs and returns data, no printing."""

from pathlib import Path

from compiler import arch, graph
from compiler.graph import build_graph
from compiler.load import load_inputs
from compiler.precheck import kv_dtype, precheck
from schemas.diagnostics import CompileError

CHECK_KEYS = ("ok", "system", "racks", "trays", "gpus", "gpus_available", "memory_domains",
              "nvlink_domains", "model", "weights_gib", "kv_bytes_per_token", "shapes",
              "diagnostics")


def check(deployment: Path) -> dict:
    """`rackc check`: inputs valid, hardware counted, which shapes fit. Raises CompileError."""
    inputs = load_inputs(deployment)
    g = build_graph(inputs)
    pre = precheck(inputs, g)
    result = {
        "ok": pre.ok,
        "system": inputs.system.name,
        "racks": g.graph["racks"],
        "trays": len(graph.trays(g)),
        "gpus": len(graph.gpus(g)),
        "gpus_available": len(graph.available_gpus(g)),
        "memory_domains": len(graph.memory_domains(g)),
        "nvlink_domains": len(graph.nvlink_domains(g)),
        "model": inputs.model_name,
        "weights_gib": round(arch.weight_bytes(inputs.model.spec) / arch.GIB, 2),
        "kv_bytes_per_token": arch.kv_bytes_per_token(inputs.model.spec, kv_dtype(inputs)),
        "shapes": [f.to_dict() for f in pre.fits],
        "diagnostics": [d.to_dict() for d in pre.diagnostics],
    }
    if not pre.ok:
        raise CompileError(pre.diagnostics, exit_code=3, result=result)
    return result


def failed_check(error: CompileError) -> dict:
    """The JSON form of a check that stopped at bad input: every key, nothing known."""
    if error.result is not None:
        return error.result
    out: dict = dict.fromkeys(CHECK_KEYS)
    out.update(ok=False, shapes=[], diagnostics=[d.to_dict() for d in error.diagnostics])
    return out


def write_text_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and rename, so a failure never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
