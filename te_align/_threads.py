"""How many CPU threads torch uses for te-align's CPU work, chosen so a busy machine does not collapse the run.

torch's default is one intra-op thread per core. Every parallel op then waits for all of its threads; when another
process holds a core, the thread that shares it runs only in that core's time slices and each op waits for it.
Measured with ``benchmarks/demo/bench_threads.py`` (the README's demo, 2 cores, another process busy on one core):
one thread finished in a fraction of the time two threads took (see the benchmark's table). On a free machine the
tiny models gain little from a second thread, since their ops are too small to split well.

So, unless the user chose (``train.threads``, ``TE_ALIGN_THREADS``, ``OMP_NUM_THREADS``): one thread for small
models (the tiny world's bases, the demo), else the cores other processes leave free by the 1-minute load average.
"""

from __future__ import annotations

import logging
import math
import os

logger = logging.getLogger("te_align.threads")

#: Below this many denoiser parameters a second thread gains little and risks the collapse above.
SMALL_MODEL_PARAMS = 50_000_000


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def busy_cores() -> float:
    """Cores other processes keep busy: the 1-minute load average (0 where the system does not report it)."""
    try:
        return max(0.0, os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def choose(n_params: int, requested: int = 0) -> tuple[int, str]:
    """``(threads, why)`` for a CPU run of a model with ``n_params`` denoiser parameters."""
    if requested > 0:
        return requested, "train.threads"
    for var in ("TE_ALIGN_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value), var
    cores = usable_cores()
    if n_params < SMALL_MODEL_PARAMS:
        return 1, f"small model ({n_params / 1e6:.1f} M parameters)"
    free = cores - math.floor(busy_cores() + 0.5)
    n = max(1, min(cores, free))
    return n, f"{cores} core(s), load {busy_cores():.1f}"


def fit(n_params: int, requested: int = 0) -> int:
    """Set torch's intra-op threads for a CPU run (see the module docstring) and log the choice once."""
    import torch

    n, why = choose(n_params, requested)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    logger.info("CPU threads: %d (%s; train.threads, TE_ALIGN_THREADS or OMP_NUM_THREADS choose another)", n, why)
    return n
