"""The Mooncake KV pool as the engines and the master see it.

vLLM 0.33's MooncakeStoreConnector runs the store embedded: every rank registers
`global_segment_size` bytes of its host's DRAM with the master. A tray's DRAM segment of the plan
is therefore split evenly over the ranks (GPUs) that run on the tray, whatever their instances,
and each tray (node) gets its own client file; a pod finds its file by its node's name.
The plan's HBM segments have no counterpart in the 0.33 store (docs/targets.md, memory budget).
"""

from compiler import ports
from compiler.names import dns_label
from compiler.plan import Plan
from targets._errors import TargetError

CONFIG_DIR = "/etc/mooncake"
MASTER_CONFIG_FILE = "master.yaml"


def pool_enabled(plan: Plan) -> bool:
    return plan.kv_pool.enabled and any(s.kind == "dram" for s in plan.kv_pool.segments)


def master_name(plan: Plan) -> str:
    return dns_label(plan.serving.name, "mooncake-master")


def master_address(plan: Plan) -> str:
    return f"{master_name(plan)}.{plan.serving.namespace}.svc.cluster.local:{ports.MOONCAKE_RPC}"


def client_config_file(node_name: str) -> str:
    return f"{node_name}.json"


def client_config_path(node_name: str) -> str:
    """`node_name` may be a variable reference such as `$(NODE_NAME)`."""
    return f"{CONFIG_DIR}/{client_config_file(node_name)}"


def segment_bytes_per_rank(plan: Plan) -> dict[str, int]:
    """Tray id -> the DRAM bytes each rank on it registers (the plan's `site`), once every
    engine tray has a DRAM segment and every segment an engine to register it."""
    dram = {s.location for s in plan.kv_pool.segments if s.kind == "dram"}
    engines = {t for i in plan.instances for t in i.trays}
    idle = sorted(dram - engines)
    if idle:
        raise TargetError(f"kv_pool.segments: DRAM segments on trays {idle} where no engine runs; "
                          "an embedded Mooncake store has no process there to register them")
    missing = sorted(engines - dram)
    if missing:
        raise TargetError(f"kv_pool.segments: trays {missing} run engines but have no DRAM "
                          "segment; every rank of the store contributes one")
    return plan.site.mooncake_segment_bytes


def client_configs(plan: Plan) -> dict[str, dict]:
    """Node name -> the `MOONCAKE_CONFIG_PATH` file of vLLM's MooncakeStoreConnector there
    (KUBERNETES.md 6.2): RDMA over the site's HCAs ("" lets Mooncake discover them,
    mooncake-store/src/real_client.cpp), or TCP where the site chose it."""
    rdma = plan.site.rdma
    return {
        plan.tray(tray).node_name: {
            "mode": "embedded",
            "metadata_server": "P2PHANDSHAKE",
            "master_server_address": master_address(plan),
            "global_segment_size": size,
            "local_buffer_size": plan.site.mooncake_local_buffer_bytes,
            "protocol": rdma.transport,
            "device_name": ",".join(rdma.hca_names) if rdma.transport == "rdma" else "",
        }
        for tray, size in segment_bytes_per_rank(plan).items()
    }


def master_config() -> dict:
    """`mooncake_master --config_path` keys; metadata by P2P handshake, so no HTTP server."""
    return {
        "rpc_address": "0.0.0.0",
        "rpc_port": ports.MOONCAKE_RPC,
        "enable_metric_reporting": True,
        "metrics_port": ports.MOONCAKE_METRICS,
    }
