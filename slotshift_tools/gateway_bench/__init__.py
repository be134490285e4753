"""`slotshift bench-gateway`: what the gateway adds to the data path, beside a C proxy.

Six targets side by side in one run, requests interleaved so that drift hits all alike:
direct to the engine, through one real `slotshift gateway` process (with a real control plane,
stream authentication on, tracing as configured), through a bare TCP relay in Python (uvloop,
no HTTP: the floor under any Python proxy's cost), through the least HTTP relay on aiohttp's
server and client (the floor under a proxy built as the gateway is), through a relay on asyncio
protocols and llhttp (httptools: the nearest step below aiohttp's server, and the gateway's
engine connections' own parser), and through HAProxy with a static per-tenant `maxconn` split
and `option http-no-delay` (when `haproxy` is installed; the bench says so when it is not). The
engine is a cheap OpenAI-compatible SSE server in a process of its own (its CPU is reported, so
that the reader sees it is not the bottleneck).

Roles, one module each:
- upstream: the SSE server (raw asyncio, pre-rendered chunks at a set pace);
- haproxy: the HAProxy config (pure) and where the binary is;
- tcp_relay: the bare TCP relay;
- aiohttp_relay: the least relay on aiohttp;
- protocol_relay: the relay on asyncio protocols and llhttp;
- stats: the figures' statistics (pure): paired differences, percentiles, medians of runs;
- processes: the processes under test, started as a user starts them, and their CPU;
- measure: the client side: sequential latency, concurrent streams, the interference window;
- report: the JSON document, the Markdown table and the plot;
- command: the command line.
"""
