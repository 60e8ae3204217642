"""The domain driver: the only code that talks to the Kubernetes API.

Plain dict bodies, the official client, one retry helper (:meth:`Api.call`) and one wait
helper (:func:`wait_for`). Steps compose these; nothing here knows about pipelines.
"""

from mnnvl.driver.api import Api, Kind
from mnnvl.driver.domain import (
    Domain,
    delete_domain,
    ensure_domain,
    launcher_owner,
    refuse_forced_single,
    refused_namespace,
    require_namespace,
    wait_for_channel_template,
)
from mnnvl.driver.lifecycle import (
    JobOutcome,
    require_domain,
    run_job,
    wait_for_job,
    wait_for_pods_running,
)
from mnnvl.driver.ownership import Deletions, create_or_adopt
from mnnvl.driver.reaper import Verdict, reap_namespace
from mnnvl.driver.wait import Deadline, wait_for
from mnnvl.driver.workload import (
    LogFollower,
    create_workload,
    delete_step_jobs,
    delete_workload,
    parse_result,
    rank0_pod,
    result_of_failed_job,
    skip_foreign_namesakes,
)

__all__ = [
    "Api",
    "Deadline",
    "Deletions",
    "Domain",
    "JobOutcome",
    "Kind",
    "LogFollower",
    "Verdict",
    "create_or_adopt",
    "create_workload",
    "delete_domain",
    "delete_step_jobs",
    "delete_workload",
    "ensure_domain",
    "launcher_owner",
    "parse_result",
    "rank0_pod",
    "reap_namespace",
    "refuse_forced_single",
    "refused_namespace",
    "require_domain",
    "require_namespace",
    "result_of_failed_job",
    "run_job",
    "skip_foreign_namesakes",
    "wait_for",
    "wait_for_channel_template",
    "wait_for_job",
    "wait_for_pods_running",
]
