#!/bin/sh
# rackc: decode-04 (DEP32, decode), node 4 of 8 (headless): ranks 12-15 on tray r1-t03, node vr-a-t03
# the model cache /var/cache/rackc/huggingface is mounted at /models
ulimit -l unlimited || echo "rackc: memlock limit stays $(ulimit -l)" >&2
export CUDA_VISIBLE_DEVICES=0,1,2,3
export HF_HOME=/models/huggingface
export MOONCAKE_CONFIG_PATH=/etc/mooncake/vr-a-t03.json
export NCCL_CUMEM_ENABLE=1
export NCCL_MNNVL_ENABLE=1
export PYTHONHASHSEED=0
export UCX_CUDA_IPC_ENABLE_MNNVL=y
export UCX_TLS=rc,sm,self,cuda_copy,cuda_ipc
export VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL=1
export VLLM_ENGINE_READY_TIMEOUT_S=3600
export VLLM_NIXL_SIDE_CHANNEL_HOST=vr-a-t03
export VLLM_NIXL_SIDE_CHANNEL_PORT=5588
export WITH_NVIDIA_PEERMEM=0
exec vllm serve deepseek-ai/DeepSeek-V4.1-Flash \
  --tensor-parallel-size 1 \
  --data-parallel-size 32 \
  --enable-expert-parallel \
  --all2all-backend deepep_low_latency \
  --max-num-seqs 140 \
  --max-num-batched-tokens 840 \
  --max-model-len 131072 \
  --block-size 128 \
  --gpu-memory-utilization 0.98 \
  --kv-cache-dtype fp8 \
  --moe-backend marlin \
  --linear-backend deep_gemm \
  --attention-backend FLASHINFER_MLA_SPARSE_DSV41 \
  --speculative-config '{"draft_sample_method":"probabilistic","method":"dspark","num_speculative_tokens":5,"rejection_sample_method":"block"}' \
  --language-model-only \
  --engram-config '{"cpu_offload":false,"embedding_across_dp":true}' \
  --kv-transfer-config '{"kv_connector":"MultiConnector","kv_connector_extra_config":{"connectors":[{"kv_connector":"NixlConnector","kv_role":"kv_both"},{"kv_connector":"MooncakeStoreConnector","kv_connector_extra_config":{"load_async":true,"lookup_async":true},"kv_role":"kv_both"}]},"kv_role":"kv_both"}' \
  --enable-auto-tool-choice \
  --tool-call-parser deepseek_v41 \
  --reasoning-parser deepseek_v41 \
  --headless \
  --data-parallel-size-local 4 \
  --data-parallel-start-rank 12 \
  --data-parallel-address vr-a-t00 \
  --data-parallel-rpc-port 13445
