"""A vLLM emulator: OpenAI API and /metrics over a model of continuous batching."""
