"""`rackc simulate`: replay a workload request by request against a compiled plan.

`cluster` reads what the simulator needs of the plan (instances, their ranks' GPUs, trays and
NVLink domains, KV capacity, pool segments) with the perf model's step times (`steps`);
`workload` makes or reads the requests; `engine` runs the discrete-event loop over `router`,
`scheduler` (vLLM 0.33's per-rank scheduling), `kv` (prefix caches, the Mooncake pool and the
links KV moves over) and `faults`; `report` turns the finished requests into metrics.
"""
