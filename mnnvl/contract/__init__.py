"""The contract between the launcher side (steps, driver, Job builder) and the worker side
(``mnnvl.runtime``): what both must agree on, in one small standard-library package.

- ``result``: the ``RESULT {json}`` line rank 0 prints and the launcher reads, and the report
  schema of that JSON (kinds, verdicts, required keys).
- ``nccl``: the NCCL profiles, written into the pod env by the Job builder and applied in the
  worker.
- ``exit_codes``: the exit-code table of the CLI and the worker pods, and the codes a retry
  cannot change (the Job's podFailurePolicy).
"""
