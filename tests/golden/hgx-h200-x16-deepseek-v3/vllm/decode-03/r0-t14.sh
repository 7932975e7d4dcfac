#!/bin/sh
# rackc: decode-03 (DEP8, decode), node 1 of 1 (leader): ranks 0-7 on tray r0-t14, node h200-node-14
# the model cache /var/cache/rackc/huggingface is mounted at /models
ulimit -l unlimited || echo "rackc: memlock limit stays $(ulimit -l)" >&2
export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
export HF_HOME=/models/huggingface
export MOONCAKE_CONFIG_PATH=/etc/mooncake/h200-node-14.json
export PYTHONHASHSEED=0
export UCX_TLS=rc,sm,self,cuda_copy,cuda_ipc
export VLLM_ENGINE_READY_TIMEOUT_S=3600
export VLLM_NIXL_SIDE_CHANNEL_HOST=h200-node-14
export VLLM_NIXL_SIDE_CHANNEL_PORT=5600
exec vllm serve deepseek-ai/DeepSeek-V3 \
  --tensor-parallel-size 1 \
  --data-parallel-size 8 \
  --enable-expert-parallel \
  --all2all-backend deepep_low_latency \
  --max-num-seqs 165 \
  --max-num-batched-tokens 330 \
  --max-model-len 32768 \
  --block-size 64 \
  --gpu-memory-utilization 0.95 \
  --kv-cache-dtype fp8 \
  --moe-backend deep_gemm \
  --linear-backend deep_gemm \
  --attention-backend FLASHMLA \
  --speculative-config '{"method":"mtp","num_speculative_tokens":1}' \
  --kv-transfer-config '{"kv_connector":"MultiConnector","kv_connector_extra_config":{"connectors":[{"kv_connector":"NixlConnector","kv_role":"kv_both"},{"kv_connector":"MooncakeStoreConnector","kv_connector_extra_config":{"load_async":true,"lookup_async":true},"kv_role":"kv_both"}]},"kv_role":"kv_both"}' \
  --port 8000 \
  --enable-auto-tool-choice \
  --tool-call-parser deepseek_v3
