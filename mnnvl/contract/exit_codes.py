"""Exit codes shared by the CLI, the errors and the worker pods (standard library only).

0 ok · 1 unexpected · 2 bad input · 3 timeout · 4 workload or verification failed ·
5 cluster/API unavailable or CRD missing; 128 + signal when interrupted (130 SIGINT,
143 SIGTERM), after teardown.
"""

from __future__ import annotations

OK = 0
UNEXPECTED = 1
BAD_INPUT = 2
TIMEOUT = 3
FAILED = 4
UNAVAILABLE = 5
INTERRUPTED_BASE = 128

# Exit codes of a worker pod whose cause a retry cannot change: 2 bad input (argparse or a
# SpecError), 4 a failed verification or training (non-finite loss), 126/127 an image that
# cannot run python3. The Job's podFailurePolicy fails the whole Job on them at once; any
# other code (1: a crash, a rank lost, a rendezvous error) is retried within
# backoff_limit_per_index. ``python -m mnnvl.runtime.launch`` keeps these codes intact
# through torchrun, which on its own reports every worker failure as 1.
NON_RETRIABLE_EXIT_CODES = (BAD_INPUT, FAILED, 126, 127)
