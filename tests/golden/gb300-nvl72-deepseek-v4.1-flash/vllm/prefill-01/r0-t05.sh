#!/bin/sh
# rackc: prefill-01 (DEP8, prefill), node 1 of 2 (leader): ranks 0-3 on tray r0-t05, node gb300-a-t05
# the model cache /var/cache/rackc/huggingface is mounted at /models
ulimit -l unlimited || echo "rackc: memlock limit stays $(ulimit -l)" >&2
export CUDA_VISIBLE_DEVICES=0,1,2,3
export HF_HOME=/models/huggingface
export MOONCAKE_CONFIG_PATH=/etc/mooncake/gb300-a-t05.json
export NCCL_CUMEM_ENABLE=1
export NCCL_MNNVL_ENABLE=1
export PYTHONHASHSEED=0
export UCX_CUDA_IPC_ENABLE_MNNVL=y
export UCX_TLS=rc,sm,self,cuda_copy,cuda_ipc
export VLLM_ENGINE_READY_TIMEOUT_S=3600
export VLLM_NIXL_SIDE_CHANNEL_HOST=gb300-a-t05
export VLLM_NIXL_SIDE_CHANNEL_PORT=5600
export WITH_NVIDIA_PEERMEM=0
exec vllm serve deepseek-ai/DeepSeek-V4.1-Flash \
  --tensor-parallel-size 1 \
  --data-parallel-size 8 \
  --enable-expert-parallel \
  --all2all-backend allgather_reducescatter \
  --max-num-seqs 64 \
  --max-num-batched-tokens 16384 \
  --max-model-len 131072 \
  --block-size 128 \
  --gpu-memory-utilization 0.98 \
  --kv-cache-dtype fp8 \
  --moe-backend flashinfer_trtllm \
  --linear-backend deep_gemm \
  --attention-backend FLASHINFER_MLA_SPARSE_DSV41 \
  --speculative-config '{"draft_sample_method":"probabilistic","method":"dspark","num_speculative_tokens":5,"rejection_sample_method":"block"}' \
  --language-model-only \
  --engram-config '{"cpu_offload":true}' \
  --kv-transfer-config '{"kv_connector":"MultiConnector","kv_connector_extra_config":{"connectors":[{"kv_connector":"NixlConnector","kv_role":"kv_both"},{"kv_connector":"MooncakeStoreConnector","kv_connector_extra_config":{"load_async":true,"lookup_async":true},"kv_role":"kv_both"}]},"kv_role":"kv_both"}' \
  --port 8000 \
  --enable-auto-tool-choice \
  --tool-call-parser deepseek_v41 \
  --reasoning-parser deepseek_v41 \
  --data-parallel-size-local 4 \
  --data-parallel-address gb300-a-t05 \
  --data-parallel-rpc-port 13445
