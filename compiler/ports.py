"""The ports rackc's processes listen on, with their sources: the one table every target, the
plan's host-port allocation (compiler.deploy) and `rackc validate` read."""

# `vllm serve --port` default (vLLM 0.33 vllm/entrypoints/common/cli_args.py l.295)
ENGINE_API = 8000
# VLLM_NIXL_SIDE_CHANNEL_PORT default (vllm/envs.py); a rank listens on it + its DP index
# (distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py)
NIXL_SIDE_CHANNEL = 5600
# Dynamo's operator injects these for multinode vLLM (deploy/operator/internal/dynamo/
# backend_vllm.go); every target uses the same ones, so a plain vLLM launch and a Dynamo one
# look alike
DP_RPC = 13445
MASTER = 29500
# the Dynamo frontend's `--http-port` default (dynamo 1.6.1 dynamo/frontend/frontend_args.py l.275)
FRONTEND_HTTP = 8000
# the lws/ router's `--port`, chosen: its pod has its own network namespace
ROUTER_HTTP = 8000
# mooncake_master defaults (Mooncake docs/source/deployment/mooncake-store-deployment-guide.md)
MOONCAKE_RPC = 50051
MOONCAKE_METRICS = 9003
