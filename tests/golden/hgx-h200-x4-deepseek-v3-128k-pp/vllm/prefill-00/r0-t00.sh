#!/bin/sh
# rackc: prefill-00 (TP8EP8PP2, prefill), node 1 of 2 (leader): ranks 0-7 on tray r0-t00, node h200-node-0
# the model cache /var/cache/rackc/huggingface is mounted at /models
ulimit -l unlimited || echo "rackc: memlock limit stays $(ulimit -l)" >&2
export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
export HF_HOME=/models/huggingface
export PYTHONHASHSEED=0
export UCX_TLS=rc,sm,self,cuda_copy,cuda_ipc
export VLLM_ENGINE_READY_TIMEOUT_S=3600
export VLLM_NIXL_SIDE_CHANNEL_HOST=h200-node-0
export VLLM_NIXL_SIDE_CHANNEL_PORT=5600
exec vllm serve deepseek-ai/DeepSeek-V3 \
  --tensor-parallel-size 8 \
  --pipeline-parallel-size 2 \
  --enable-expert-parallel \
  --max-num-seqs 64 \
  --max-num-batched-tokens 16384 \
  --max-model-len 135168 \
  --block-size 64 \
  --gpu-memory-utilization 0.95 \
  --kv-cache-dtype fp8 \
  --moe-backend deep_gemm \
  --linear-backend deep_gemm \
  --attention-backend FLASHMLA \
  --kv-transfer-config '{"kv_connector":"NixlPushConnector","kv_role":"kv_both"}' \
  --port 8000 \
  --enable-auto-tool-choice \
  --tool-call-parser deepseek_v3 \
  --distributed-executor-backend mp \
  --nnodes 2 \
  --node-rank 0 \
  --master-addr h200-node-0 \
  --master-port 29500
