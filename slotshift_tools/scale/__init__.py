"""`slotshift bench-scale`: one real control plane against many simulated gateways.

G simulated gateways speak the real `GatewayService.Connect` protocol (hello, demand reports,
acknowledgements) to ONE control-plane process started from a generated config with T tenants,
and the benchmark measures what that costs the control plane and whether decisions stay on time.

Roles, one module each:
- grid: the (tenants, gateways) points and the budget each gets;
- dynamics: the demand the gateways see (pure, numpy, seeded);
- budget: the budget check at every instant from the gateways' side (pure);
- figures: the statistics of one point (pure);
- procfs: CPU and memory of processes, read from /proc;
- generator: the load generator's processes (asyncio + grpc.aio, several gateways each);
- point: one grid point, from the control plane's start to its JSON;
- report: the grid's JSON, its plot and its Markdown table;
- command: the command line.
"""
