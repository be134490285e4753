"""The deterministic twin: `slotshift simulate SCENARIO.yaml` runs a bench scenario's whole loop
(load, gateways, control plane, engine) in virtual time, calling the production code."""
