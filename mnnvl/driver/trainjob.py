"""The run's Kubeflow Trainer TrainJobs in teardown and reaping: deleted before the domain.

A TrainJob's JobSet, Jobs, pods and headless Service are Trainer's and JobSet's, owned by the
TrainJob, so deleting it removes them through garbage collection; the domain may go only once
those pods are gone (they hold its IMEX channel).
"""

from __future__ import annotations

import logging
from typing import Any

from mnnvl.driver.api import Api, Kind
from mnnvl.driver.ownership import Deletions
from mnnvl.errors import NotFound, Refused
from mnnvl.inputs.names import RunNames

logger = logging.getLogger(__name__)
TRAINJOB = Kind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs")
# JobSet's label on every pod of a JobSet, which Trainer names after the TrainJob.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def run_trainjobs(api: Api, namespace: str, run_id: str) -> list[dict[str, Any]]:
    """The run's TrainJobs, by name.

    A cluster without Trainer (404) has none. A runner without ``manifests/overlays/trainer``
    (403; also where Trainer is not installed, as RBAC answers before routing) cannot see
    them: logged at debug level, as every Job-only run meets it; the pods' wait still covers
    the TrainJobs this project renders, whose pods carry the run's labels.
    """
    selector = RunNames.for_run(run_id).selector
    try:
        found = api.list(TRAINJOB, namespace, label_selector=selector)["items"]
    except NotFound:
        return []
    except Refused:
        logger.debug(
            "cannot list TrainJobs in %s (manifests/overlays/trainer grants it): a TrainJob of "
            "run %s is not seen",
            namespace,
            run_id,
        )
        return []
    return sorted(found, key=lambda o: str(o["metadata"]["name"]))


def delete_trainjobs(api: Api, namespace: str, gone: Deletions) -> list[str]:
    """Delete the run's TrainJobs (``run_trainjobs``); the names of those deleted now."""
    return [
        obj["metadata"]["name"]
        for obj in run_trainjobs(api, namespace, gone.run_id)
        if gone.delete(api, TRAINJOB, obj, propagation="Background")
    ]


def trainjob_pods_selector(names: list[str]) -> str:
    """The pods of these TrainJobs (their JobSets'), whatever labels a user's own TrainJob gave."""
    return f"{JOBSET_NAME_LABEL} in ({','.join(sorted(names))})"
