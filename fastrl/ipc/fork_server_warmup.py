"""Work every child of a run would otherwise repeat after it is forked: imported by the fork
server (fastrl.ipc.start.PRELOADED), and by nothing else.

Profiled over three warm runs of cartpole-appo in one process (one worker, 4,096 env steps each,
py-spy over the runner and its children, a 2-vCPU AVX2 EPYC), 10.3 of their 12.6 CPU-seconds went
to two first-use costs, paid again in each new child:
- the learner's first ``torch.optim`` optimizer imports ``torch._dynamo`` (torch wraps the
  optimizer's methods to keep them out of compiled graphs): 2.2 s;
- numba's CPU target builds its registries and its runtime (NRT) on the first kernel a process
  calls, even one loaded from numba's on-disk cache: 1.2 s a run, in its worker and batcher.
Done here once, both are inherited by every fork. The only thread they add is the idle pool of
the OpenBLAS that numba's registries load through scipy, as numpy's own OpenBLAS starts one on
import: OpenBLAS stops its pool before a fork (its fork handler), and no Python thread is started."""
import gc

import torch._dynamo  # noqa: F401  (the import is the work)

try:
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()  # what numba does on a process's first kernel
except (ImportError, AttributeError):
    # numba's internals moved in some release: each child loads its registries on first use, as
    # before. The fork server ignores only an ImportError of what it preloads; anything else here
    # would stop it, and every run with it.
    pass

# Last: everything imported above stays for the server's life and its children's, so the
# collector need never walk it again, in the server (whose own exit then takes 0.15 s, not ~1 s:
# fastrl.ipc.fast_exit) or in a forked child, whose collections would also write to the pages
# it shares with the server.
gc.freeze()
