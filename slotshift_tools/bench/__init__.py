"""`slotshift bench`: the study's experiment, and others like it, run against the local stack.

A scenario (`bench/scenarios/*.yaml`, slotshift_tools.bench.scenario) names tenants, their load and
the policies to compare. For each policy the harness starts the local stack as real processes with a
generated config, drives the load through the real gateways with streaming requests, samples the
control plane and the engine, and stops the stack; then it writes `summary.json` with
`vllm bench serve`'s field names, a markdown table and plots.

Layout: scenario (the file format), arrivals (when requests are sent), trace and stats (what each
request did and the pure statistics over it), decisions (the controller's trajectory), client,
load, sampler and progress (the I/O while a policy runs), stack_config and runner (one policy's
run), summary and plots (the results), command (the whole benchmark, for the CLI).
"""
