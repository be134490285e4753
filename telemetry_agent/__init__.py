"""The telemetry agent: NVML and vLLM /metrics, streamed to the control plane."""
