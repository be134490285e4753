"""slotshift's tools, the top floor: the CLI, the local stack, the demo, the benchmarks (bench,
the emulator's calibration, fidelity and trade-off studies), the soak, and the vLLM-CPU tier.

They stand on the ground (`slotshift`: the generated API, config, small primitives), use the
services' pure cores as libraries (the policy core, admission, the emulator's engine core) and
start the services only as processes; `slotshift_tools.cli` is the one module that imports the
services' mains, to run each of them as a `slotshift` subcommand. The import-linter contracts in
pyproject.toml hold these floors.
"""
