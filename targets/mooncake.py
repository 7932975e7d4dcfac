"""mooncake: the KV pool's configs, `mooncake/`: the master's `--config_path` file, one client
file (`MOONCAKE_CONFIG_PATH`) per node that runs engines, and the master's ConfigMap, Service and
Deployment with the clients' ConfigMap in `kubernetes.yaml`. Nothing without a pool."""

from compiler.plan import Plan
from targets import _kube, _mooncake
from targets._yaml import dump_documents, dump_json, dump_yaml


def emit(plan: Plan) -> dict[str, str]:
    if not _mooncake.pool_enabled(plan):
        return {}
    files = {f"mooncake/{_mooncake.MASTER_CONFIG_FILE}": dump_yaml(_mooncake.master_config()),
             "mooncake/kubernetes.yaml": dump_documents(_kube.mooncake_bundle(plan))}
    for node, config in _mooncake.client_configs(plan).items():
        files[f"mooncake/clients/{_mooncake.client_config_file(node)}"] = dump_json(config)
    return dict(sorted(files.items()))
