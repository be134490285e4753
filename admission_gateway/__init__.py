"""The admission gateway: an OpenAI-compatible reverse proxy that admits within pushed limits."""
