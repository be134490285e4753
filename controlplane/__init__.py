"""The control plane: receives demand and telemetry, decides zero-sum allocations, pushes them."""
