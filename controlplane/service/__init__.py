"""gRPC adapters of the control plane: they translate messages and call PoolState; no policy."""
