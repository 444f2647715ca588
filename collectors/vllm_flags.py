"""The command-line options of vLLM 0.32's OpenAI server, as its own parser reads them.

The collector interprets some flags itself (``collectors.engine.FLAGS``). Every other flag the
engine was started with goes into the fingerprint's ``engine.other_flags`` with its value, so
two engines that differ in a flag the collector does not interpret never share an ID; only the
flags in :data:`DEPLOYMENT_ONLY` (where the server listens, what it logs, where it downloads,
addresses of its peers), which cannot change the tokens or logprobs it computes, are left out.

The arity of each option (a switch, one value, a list up to the next flag) decides what the
next argument is; the tables below are vLLM 0.32's (``make_arg_parser``), checked against the
installed vLLM by ``tests/collectors/test_vllm_flags.py``.
"""

from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


SWITCHES = _names(
    """
    --aggregate-engine-logging --allow-credentials --allow-deprecated-quantization
    --async-scheduling --cohere-is-reasoning-model --cudagraph-metrics
    --data-parallel-external-lb --data-parallel-hybrid-lb --data-parallel-multi-port-external-lb
    --dcp-q-replicate --disable-cascade-attn --disable-chunked-mm-input
    --disable-custom-all-reduce --disable-fastapi-docs --disable-hybrid-kv-cache-manager
    --disable-log-stats --disable-nccl-for-dp-synchronization --disable-sliding-window
    --disable-uvicorn-access-log --enable-auto-tool-choice --enable-batch-sharded-sampling
    --enable-chunked-prefill --enable-cumem-allocator --enable-dbo --enable-elastic-ep
    --enable-ep-weight-filter --enable-eplb --enable-expert-parallel --enable-fault-tolerance
    --enable-flash-late-interaction --enable-flashinfer-autotune --enable-force-include-usage
    --enable-hc-sp --enable-layerwise-nvtx-tracing --enable-log-deltas --enable-log-outputs
    --enable-log-requests --enable-logging-iteration-details --enable-lora
    --enable-mamba-cache-stochastic-rounding --enable-mamba-shared-prefix-checkpoint
    --enable-mfu-metrics --enable-mixed-moe-lora-format --enable-mm-embeds
    --enable-moe-shared-loras --enable-nccl-comm-suspend --enable-offline-docs
    --enable-per-request-metrics --enable-prefix-caching --enable-prompt-embeds
    --enable-prompt-tokens-details --enable-request-id-headers --enable-return-routed-experts
    --enable-scale-out --enable-server-load-tracking --enable-shm-tensor-arena
    --enable-sleep-mode --enable-ssl-refresh --enable-tokenizer-info-endpoint
    --enable-tower-connector-lora --enable-trace-replay --enforce-eager
    --exclude-tools-when-tool-choice-none --fail-on-environ-validation --fully-sharded-loras
    --grpc --headless --help --interleave-mm-strings --jit-monitor-verbose --kv-cache-metrics
    --kv-sharing-fast-prefill --language-model-only --log-error-stack
    --long-prefill-token-threshold-adaptive --mm-device-do-normalize --mm-encoder-only
    --no-allow-credentials --no-allow-deprecated-quantization --no-async-scheduling
    --no-cohere-is-reasoning-model --no-cudagraph-metrics --no-data-parallel-external-lb
    --no-data-parallel-hybrid-lb --no-dcp-q-replicate --no-disable-cascade-attn
    --no-disable-chunked-mm-input --no-disable-custom-all-reduce --no-disable-fastapi-docs
    --no-disable-hybrid-kv-cache-manager --no-disable-nccl-for-dp-synchronization
    --no-disable-sliding-window --no-disable-uvicorn-access-log --no-enable-auto-tool-choice
    --no-enable-batch-sharded-sampling --no-enable-chunked-prefill --no-enable-cumem-allocator
    --no-enable-dbo --no-enable-elastic-ep --no-enable-ep-weight-filter --no-enable-eplb
    --no-enable-expert-parallel --no-enable-fault-tolerance --no-enable-flash-late-interaction
    --no-enable-flashinfer-autotune --no-enable-force-include-usage --no-enable-hc-sp
    --no-enable-layerwise-nvtx-tracing --no-enable-log-deltas --no-enable-log-outputs
    --no-enable-log-requests --no-enable-logging-iteration-details --no-enable-lora
    --no-enable-mamba-cache-stochastic-rounding --no-enable-mamba-shared-prefix-checkpoint
    --no-enable-mfu-metrics --no-enable-mixed-moe-lora-format --no-enable-mm-embeds
    --no-enable-moe-shared-loras --no-enable-nccl-comm-suspend --no-enable-offline-docs
    --no-enable-per-request-metrics --no-enable-prefix-caching --no-enable-prompt-embeds
    --no-enable-prompt-tokens-details --no-enable-request-id-headers
    --no-enable-return-routed-experts --no-enable-scale-out --no-enable-server-load-tracking
    --no-enable-shm-tensor-arena --no-enable-sleep-mode --no-enable-ssl-refresh
    --no-enable-tokenizer-info-endpoint --no-enable-tower-connector-lora
    --no-enable-trace-replay --no-enforce-eager --no-exclude-tools-when-tool-choice-none
    --no-fail-on-environ-validation --no-fully-sharded-loras --no-interleave-mm-strings
    --no-jit-monitor-verbose --no-kv-cache-metrics --no-kv-sharing-fast-prefill
    --no-language-model-only --no-log-error-stack --no-long-prefill-token-threshold-adaptive
    --no-mm-device-do-normalize --no-mm-encoder-only --no-numa-bind --no-ray-workers-use-nsight
    --no-return-sampling-mask --no-return-tokens-as-token-ids --no-scheduler-reserve-full-isl
    --no-skip-mm-profiling --no-skip-tokenizer-init --no-sleep-mode-offload-cudagraph
    --no-specialize-active-lora --no-swa-bounded-replay --no-tokens-only --no-trust-remote-code
    --no-trust-request-chat-template --no-trust-request-mm-kwargs --no-use-fp64-gumbel
    --no-use-replayssm --no-use-tqdm-on-load --numa-bind --ray-workers-use-nsight
    --return-sampling-mask --return-tokens-as-token-ids --scheduler-reserve-full-isl
    --skip-mm-profiling --skip-tokenizer-init --sleep-mode-offload-cudagraph
    --specialize-active-lora --swa-bounded-replay --tokens-only --trust-remote-code
    --trust-request-chat-template --trust-request-mm-kwargs --use-fp64-gumbel --use-replayssm
    --use-tqdm-on-load -dpe -dph -dpm -ep -h
"""
)

LISTS = _names(
    """
    --allowed-media-domains --api-key --collect-detailed-traces --cpu-offload-params
    --cudagraph-capture-sizes --ignore-patterns --kv-cache-dtype-skip-layers --logits-processors
    --lora-modules --lora-target-modules --numa-bind-cpus --numa-bind-nodes --offload-params
    --served-model-name --sleep-preserve-parameter-names
"""
)

OPTIONAL_VALUE = _names(
    """
    --hf-token
"""
)

ONE_VALUE = _names(
    """
    --additional-config --all2all-backend --allowed-headers --allowed-local-media-path
    --allowed-methods --allowed-origins --anthropic-disabled-thinking-effort --api-server-count
    --attention-backend --attention-config --aux-output-config --block-size --chat-template
    --chat-template-content-format --code-revision --cohere-format --compilation-config --config
    --config-format --convert --cp-kv-cache-interleave-size --cpu-distributed-timeout-seconds
    --cpu-offload-gb --custom-histogram-buckets --data-parallel-address --data-parallel-backend
    --data-parallel-rank --data-parallel-rpc-port --data-parallel-size
    --data-parallel-size-local --data-parallel-start-rank --data-parallel-supervisor-port
    --dbo-decode-token-threshold --dbo-prefill-token-threshold --dcp-comm-backend
    --dcp-kv-cache-interleave-size --decode-context-parallel-size --default-chat-template-kwargs
    --default-mm-loras --device-ids --device-memory-utilization --diffusion-config
    --disable-access-log-for-endpoints --distributed-executor-backend
    --distributed-timeout-seconds --download-dir --dp-supervisor-probe-failure-threshold
    --dp-supervisor-probe-interval-s --dp-supervisor-probe-timeout-s --dp-sync-interval --dtype
    --ec-manager-config --ec-transfer-config --elastic-ep-max-dp-size --engram-config
    --eplb-config --expert-placement-strategy --fault-tolerance-config --fingerprint-mode
    --fingerprint-value --gdn-prefill-backend --generation-config --gpu-memory-utilization
    --grpc-port --h11-max-header-count --h11-max-incomplete-event-size --hf-config-path
    --hf-overrides --host --io-processor-plugin --ir-op-priority --jit-monitor-mode
    --kda-decode-backend --kda-prefill-backend --kernel-config --kv-cache-dtype
    --kv-cache-memory-bytes --kv-cache-metrics-sample --kv-events-config --kv-offloading-backend
    --kv-offloading-size --kv-transfer-config --limit-mm-per-prompt --linear-backend
    --load-format --log-config-file --log-level --logging-config --logprobs-mode
    --long-prefill-token-threshold --lora-dtype --mamba-backend --mamba-block-size
    --mamba-cache-dtype --mamba-cache-mode --mamba-cache-philox-rounds --mamba-ssm-cache-dtype
    --mamba-ssu-algorithm --master-addr --master-port --max-cpu-loras
    --max-cudagraph-capture-size --max-log-len --max-logprobs --max-lora-cls-labels
    --max-lora-rank --max-loras --max-model-len --max-num-active-seqs --max-num-batched-tokens
    --max-num-queued-reqs --max-num-queued-tokens --max-num-scheduled-tokens --max-num-seqs
    --max-parallel-loading-workers --media-io-kwargs --middleware --mm-encoder-attn-backend
    --mm-encoder-attn-dtype --mm-encoder-fp8-scale-path --mm-encoder-fp8-scale-save-margin
    --mm-encoder-fp8-scale-save-path --mm-encoder-tp-mode --mm-hasher-algorithm
    --mm-ipc-gpu-memory-gb --mm-processor-cache-gb --mm-processor-cache-type
    --mm-processor-device --mm-processor-kwargs --mm-shm-cache-max-object-size-mb
    --mm-tensor-ipc --model --model-class-overrides --model-impl --model-loader-extra-config
    --moe-backend --nnodes --node-rank --num-gpu-blocks-override --offload-backend
    --offload-group-size --offload-num-in-group --offload-prefetch-step --optimization-level
    --otlp-traces-endpoint --override-generation-config --per-request-spec-decode-metrics
    --performance-mode --pipeline-parallel-size --pooler-config --port
    --prefill-context-parallel-size --prefill-schedule-interval
    --prefix-cache-retention-interval --prefix-caching-hash-algo --prefix-match-unit
    --profiler-config --pt-load-map-location --quantization --quantization-config
    --reasoning-config --reasoning-parser --reasoning-parser-plugin --renderer-num-workers
    --replayssm-buffer-len --response-role --revision --root-path --runner
    --safetensors-load-strategy --safetensors-prefetch-block-size
    --safetensors-prefetch-num-threads --scheduler-cls --scheduling-policy --seed
    --show-hidden-metrics-for-version --shutdown-timeout --sparse-indexer-topk-backend
    --spec-method --spec-model --spec-tokens --speculative-config --sse-keep-alive-interval
    --ssl-ca-certs --ssl-cert-reqs --ssl-certfile --ssl-ciphers --ssl-keyfile --stream-interval
    --structured-outputs-config --tensor-parallel-size --tokenizer --tokenizer-mode
    --tokenizer-revision --tool-call-parser --tool-parser-plugin --tool-server
    --tool-strict-level --ubatch-size --uds --uvicorn-log-level --video-pruning-method
    --video-pruning-rate --watermark --watermark-config --weight-transfer-config --worker-cls
    --worker-extension-cls -ac -asc -cc -dc -dcp -dp -dpa -dpb -dpl -dpn -dpp -dpr -n -pcp -pp
    -q -r -sc -tp
"""
)

# short forms, read as their long names so both spellings give one fingerprint
ALIASES = {
    "-h": "--help",
    "-asc": "--api-server-count",
    "-q": "--quantization",
    "-pp": "--pipeline-parallel-size",
    "-n": "--nnodes",
    "-r": "--node-rank",
    "-tp": "--tensor-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpn": "--data-parallel-rank",
    "-dpr": "--data-parallel-start-rank",
    "-dpl": "--data-parallel-size-local",
    "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port",
    "-dpb": "--data-parallel-backend",
    "-dph": "--data-parallel-hybrid-lb",
    "-dpe": "--data-parallel-external-lb",
    "-dpm": "--data-parallel-multi-port-external-lb",
    "-ep": "--enable-expert-parallel",
    "-sc": "--speculative-config",
    "-dc": "--diffusion-config",
    "-cc": "--compilation-config",
    "-ac": "--attention-config",
}

# options given more than once accumulate (argparse "append"); others keep the last
APPEND = frozenset({"--middleware"})

# Flags that cannot change what the engine computes for a request: where the server listens and
# whom it lets in, what it logs, traces and counts, where and how fast it loads files, how it
# reaches its peers and which of this host's devices and ranks it takes (the GPU section
# describes the devices), and flags the collector reads elsewhere (the model, --config, the chat
# template, the tokenizer, the fingerprint mode). Their long names; --no- forms follow them.
DEPLOYMENT_ONLY = _names(
    """
    --help --host --port --uds --grpc --grpc-port --root-path --api-key --api-server-count
    --headless --shutdown-timeout --uvicorn-log-level --disable-uvicorn-access-log
    --disable-access-log-for-endpoints --allow-credentials --allowed-origins --allowed-methods
    --allowed-headers --ssl-keyfile --ssl-certfile --ssl-ca-certs --enable-ssl-refresh
    --ssl-cert-reqs --ssl-ciphers --enable-request-id-headers --disable-fastapi-docs
    --enable-offline-docs --h11-max-incomplete-event-size --h11-max-header-count
    --sse-keep-alive-interval --enable-tokenizer-info-endpoint --enable-server-load-tracking
    --enable-prompt-tokens-details --enable-force-include-usage
    --data-parallel-supervisor-port --dp-supervisor-probe-interval-s
    --dp-supervisor-probe-timeout-s --dp-supervisor-probe-failure-threshold
    --disable-log-stats --aggregate-engine-logging --enable-log-requests --max-log-len
    --enable-log-outputs --enable-log-deltas --log-error-stack --enable-per-request-metrics
    --logging-config --log-level --log-config-file --show-hidden-metrics-for-version
    --otlp-traces-endpoint --collect-detailed-traces --per-request-spec-decode-metrics
    --kv-cache-metrics --kv-cache-metrics-sample --custom-histogram-buckets --cudagraph-metrics
    --enable-mfu-metrics --enable-logging-iteration-details --jit-monitor-mode
    --jit-monitor-verbose --enable-layerwise-nvtx-tracing --profiler-config
    --fail-on-environ-validation
    --hf-token --download-dir --use-tqdm-on-load --safetensors-load-strategy
    --safetensors-prefetch-num-threads --safetensors-prefetch-block-size
    --max-parallel-loading-workers --allowed-local-media-path --allowed-media-domains
    --master-addr --master-port --node-rank --data-parallel-address --data-parallel-rpc-port
    --data-parallel-rank --data-parallel-start-rank --data-parallel-size-local --device-ids
    --distributed-timeout-seconds
    --cpu-distributed-timeout-seconds --ray-workers-use-nsight --numa-bind --numa-bind-nodes
    --numa-bind-cpus
    --model --config --chat-template --tokenizer --fingerprint-mode --fingerprint-value
    """
)
