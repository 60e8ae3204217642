"""The domain driver: the only code that talks to the Kubernetes API.

Plain dict bodies, the official client, one retry wrapper (:meth:`Api.call`) and one wait
helper (:func:`wait_for`). Steps compose these; nothing here knows about pipelines.
"""

from mnnvl.driver.api import Api
from mnnvl.driver.domain import (
    delete_domain,
    ensure_domain,
    launcher_owner,
    refuse_forced_single,
    refused_namespace,
    require_namespace,
    wait_for_channel_template,
)
from mnnvl.driver.lifecycle import run_job
from mnnvl.driver.ownership import Deletions
from mnnvl.driver.reaper import Verdict, reap_namespace
from mnnvl.driver.wait import Deadline
from mnnvl.driver.workload import delete_step_jobs, delete_workload, skip_foreign_namesakes

__all__ = [
    "Api",
    "Deadline",
    "Deletions",
    "Verdict",
    "delete_domain",
    "delete_step_jobs",
    "delete_workload",
    "ensure_domain",
    "launcher_owner",
    "reap_namespace",
    "refuse_forced_single",
    "refused_namespace",
    "require_namespace",
    "run_job",
    "skip_foreign_namesakes",
    "wait_for_channel_template",
]
