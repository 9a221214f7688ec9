"""End to end: the commands as subprocesses, torchrun, two nodes, injected faults."""
