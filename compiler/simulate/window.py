"""A run's steady state: the requests after the first WARM_SHARE (warm-up: queues and decode
batches filling) and before the last COOL_SHARE (the run draining), by issue order. Imports
nothing, so the targets may read it (compiler.simulate.compare) without the simulator."""

WARM_SHARE = 0.2
COOL_SHARE = 0.2
