"""pool-matches-plan: each Mooncake client file (`mooncake/clients/<node>.json`, what
MOONCAKE_CONFIG_PATH names for vLLM's MooncakeStoreConnector) registers the plan's segment for
its tray over the plan's transport and HCAs. A client on the wrong HCAs, or with "" while the
site names them, lets Mooncake pick rails without a route to its peers (bundle review 3,
S3-17); a segment other than the plan's is a pool the memory map and the prediction do not
describe."""

import json
from typing import Any

from compiler.plan import Plan
from compiler.validate.finding import Finding

RULE = "pool-matches-plan"
PREFIX = "mooncake/clients/"
HINT = "compile again (rackc compile -o OUT) rather than editing the client files"


def _expected(plan: Plan) -> dict[str, dict[str, Any]]:
    """Node name -> the fields the plan decides."""
    rdma = plan.site.rdma
    device = ",".join(rdma.hca_names) if rdma.transport == "rdma" else ""
    return {plan.tray(tray).node_name: {"global_segment_size": size,
                                        "protocol": rdma.transport, "device_name": device}
            for tray, size in plan.site.mooncake_segment_bytes.items()}


def pool_matches_plan(ctx: Any) -> list[Finding]:
    want = _expected(ctx.plan) if ctx.plan.kv_pool.enabled else {}
    out = []
    for path in sorted(p for p in ctx.files if p.startswith(PREFIX) and p.endswith(".json")):
        node = path[len(PREFIX):].removesuffix(".json")
        text = ctx.files[path]
        try:
            got = json.loads(text if isinstance(text, str) else text.decode())
        except ValueError:
            got = None
        if node not in want or not isinstance(got, dict):
            out.append(Finding(RULE, path, 1, path, "a client file of a node whose tray holds a "
                               "pool segment of the plan", "none of the plan's", HINT))
            continue
        for key, value in want[node].items():
            if got.get(key) != value:
                out.append(Finding(RULE, path, 1, f"{path} {key}",
                                   f"{key} {value!r} (plan.yaml site)", repr(got.get(key)),
                                   HINT))
    missing = sorted(set(want) - {p[len(PREFIX):].removesuffix(".json") for p in ctx.files
                                  if p.startswith(PREFIX)})
    if any(p.startswith(PREFIX) for p in ctx.files):
        out += [Finding(RULE, f"{PREFIX}{n}.json", 1, f"{PREFIX}{n}.json", "a client file for "
                        "every node with a pool segment", "missing", HINT) for n in missing]
    return out
