"""A Kubeflow Trainer stand-in (``SimCluster(trainer=True)``): TrainJobs run as Trainer's torch
runtime runs them, with the JobSet between them played in place (no JobSet object).

From kubeflow/trainer (main after v2.3.0, plus v2.4.0's ``resourceClaimsPerNode``):
- the runtime's replicated job ``node`` becomes one Indexed Job ``<trainjob>-node-0`` of
  ``numNodes`` pods (JobSet's child Job name ``<jobset>-<replicatedJob>-<index>``; the JobSet is
  named after the TrainJob, ``pkg/runtime/framework/plugins/jobset/jobset.go``), pods
  ``<trainjob>-node-0-<i>-<hash>``, hostname ``<trainjob>-node-0-<i>``, subdomain
  ``<trainjob>``, and a headless Service ``<trainjob>`` selecting the JobSet's pods;
- the ``node`` container gets the TrainJob's image, command, args and env, then
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the completion index),
  ``PET_MASTER_ADDR`` (``<trainjob>-node-0-0.<trainjob>``) and ``PET_MASTER_PORT`` (29500)
  (``pkg/runtime/framework/plugins/torch/torch.go``, ``EnforceMLPolicy``), its
  ``resourcesPerNode``, and the ``resourceClaimsPerNode`` claims (in the pod's
  ``resourceClaims`` and the container's ``resources.claims``, merged by name);
- ``runtimePatches``: pod labels and annotations, affinity, tolerations, node selector,
  security context, service account, volumes and the containers' volume mounts, env and
  security context (``pkg/apis/trainer/v1alpha1/trainjob_types.go``, ``PodSpecPatch``);
- restarts as JobSet's ``failurePolicy`` (default ``Recreate``): when the child Job fails and
  fewer than ``maxRestarts`` restarts were made, the Job and all its pods are deleted and made
  again with label ``jobset.sigs.k8s.io/restart-attempt`` one higher; else the TrainJob is
  ``Failed``. A completed Job makes it ``Complete``. Trainer copies the JobSet's conditions
  with the type renamed (``jobset.go``, ``TrainJobStatus``); reasons and messages are JobSet's.
- ``spec.suspend`` (set by Kueue until it admits the TrainJob): Trainer keeps the JobSet
  suspended (``jobset.go`` copies ``Suspend``), so no Job and no pod is made; suspended again
  after it ran, the Job is suspended and its pods go.

Not modelled: initializers, other runtimes' policies (MPI, ...), ``managedBy``,
Trainer's webhooks (a TrainJob naming a missing runtime gets ``Failed`` with reason
``TrainingRuntimeNotSupported`` instead of a refused create), JobSet's other failure-policy rules
and success policies.
"""

from __future__ import annotations

import copy
import logging

from mnnvl.sim.api.controller import Controller
from mnnvl.sim.api.model import controller_ref, finished
from mnnvl.sim.api.store import ApiError, Obj, Store, WatchEvent, now_iso

log = logging.getLogger(__name__)
API_VERSION = "trainer.kubeflow.org/v1alpha1"
NODE = "node"
TRAINER_PORT = 29500
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# JobSet's condition reasons and messages (kubernetes-sigs/jobset pkg/constants).
COMPLETED = ("AllJobsCompleted", "jobset completed successfully")
FAILED_JOBS = ("FailedJobs", "jobset failed due to one or more job failures")
MAX_RESTARTS = ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")


class TrainerStandIn(Controller):
    name = "sim-trainer"
    kinds = ("trainjobs", "jobs")

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        # TrainJob uid -> restarts made: the JobSet's ``status.restarts`` (no JobSet object here).
        self.restarts: dict[str, int] = {}

    def on_events(self, events: list[WatchEvent]) -> None:
        todo: dict[tuple[str, str], None] = {}
        for ev in events:
            meta = ev.obj.get("metadata") or {}
            if ev.type == "DELETED":
                continue
            if ev.resource == "trainjobs":
                todo[(ev.namespace or meta.get("namespace", ""), meta["name"])] = None
            elif JOBSET_NAME in (meta.get("labels") or {}):
                todo[(meta.get("namespace", ""), meta["labels"][JOBSET_NAME])] = None
        for ns, name in todo:
            tj = self.store.find("trainjobs", ns, name)
            if tj is not None and not tj["metadata"].get("deletionTimestamp"):
                self.sync(tj)

    def sync(self, tj: Obj) -> None:
        if finished(tj.get("status") or {}):
            return
        ns, name = tj["metadata"]["namespace"], tj["metadata"]["name"]
        runtime = self.runtime(tj)
        if runtime is None:
            ref = tj["spec"]["runtimeRef"]
            why = f"{ref.get('kind', 'ClusterTrainingRuntime')} {ref['name']} not found"
            return self.condition(tj, "Failed", ("TrainingRuntimeNotSupported", why))
        job = self.store.find("jobs", ns, f"{name}-{NODE}-0")
        suspend = bool(tj["spec"].get("suspend"))
        if job is None and suspend:
            return  # the JobSet stays suspended: no Job, no pod
        if job is None:
            self.ensure_service(tj)
            self.create_job(tj, runtime, self.restarts.get(tj["metadata"]["uid"], 0))
            return
        if bool(job["spec"].get("suspend")) != suspend:
            name = job["metadata"]["name"]
            self.store.mutate("jobs", ns, name, lambda o: suspend_job(o, suspend))
            return
        status = job.get("status") or {}
        if any_condition(status, "Complete"):
            self.condition(tj, "Complete", COMPLETED)
        elif any_condition(status, "Failed") and not job["metadata"].get("deletionTimestamp"):
            self.failed(tj, runtime, job)

    def failed(self, tj: Obj, runtime: Obj, job: Obj) -> None:
        """JobSet's ``Recreate``: delete the Job (its pods go with it) and make it again."""
        policy = runtime["spec"]["template"]["spec"].get("failurePolicy") or {}
        done = self.restarts.get(tj["metadata"]["uid"], 0)
        limit = int(policy.get("maxRestarts", 0))
        if done >= limit:
            self.condition(tj, "Failed", MAX_RESTARTS if limit else FAILED_JOBS)
            return
        self.restarts[tj["metadata"]["uid"]] = done + 1
        log.info("TrainJob %s: restart %d of %d", tj["metadata"]["name"], done + 1, limit)
        ns = tj["metadata"]["namespace"]
        self.store.delete("jobs", ns, job["metadata"]["name"], propagation="Background")
        self.create_job(tj, runtime, done + 1)

    def runtime(self, tj: Obj) -> Obj | None:
        ref = tj["spec"]["runtimeRef"]
        if ref.get("kind", "ClusterTrainingRuntime") == "TrainingRuntime":
            return self.store.find("trainingruntimes", tj["metadata"]["namespace"], ref["name"])
        return self.store.find("clustertrainingruntimes", "", ref["name"])

    def ensure_service(self, tj: Obj) -> None:
        name, ns = tj["metadata"]["name"], tj["metadata"]["namespace"]
        if self.store.find("services", ns, name) is not None:
            return
        port = {"name": NODE, "port": TRAINER_PORT, "targetPort": TRAINER_PORT, "protocol": "TCP"}
        svc = {
            "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner(tj)]},
            "spec": {
                "clusterIP": "None",
                "selector": {JOBSET_NAME: name},
                "ports": [port],
                "publishNotReadyAddresses": True,
            },
        }
        self.store.create("services", svc)

    def create_job(self, tj: Obj, runtime: Obj, attempt: int) -> None:
        name, ns = tj["metadata"]["name"], tj["metadata"]["namespace"]
        node = next(
            r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"] if r["name"] == NODE
        )
        job_spec = copy.deepcopy(node["template"]["spec"])
        nodes = int((tj["spec"].get("trainer") or {}).get("numNodes") or 1)
        labels = {JOBSET_NAME: name, REPLICATED_JOB: NODE, RESTART_ATTEMPT: str(attempt)}
        template = pod_template(tj, job_spec["template"], labels)
        job_spec |= {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "template": template,
        }
        job = {
            "metadata": {
                "name": f"{name}-{NODE}-0",
                "namespace": ns,
                "labels": dict(labels),
                "ownerReferences": [owner(tj)],
            },
            "spec": job_spec,
        }
        try:
            self.store.create("jobs", job)
        except ApiError as e:  # the deleted one still there: try again shortly
            log.info("TrainJob %s: Job not created yet (%s)", name, e)
            self.requeue(0.1, "trainjobs", ns, name)

    def condition(self, tj: Obj, kind: str, why: tuple[str, str]) -> None:
        cond = {"type": kind, "status": "True", "reason": why[0], "message": why[1]}
        cond["lastTransitionTime"] = now_iso()

        def put(obj: Obj) -> None:
            status = obj.setdefault("status", {})
            status["conditions"] = [
                c for c in status.get("conditions") or [] if c["type"] != kind
            ] + [cond]

        self.store.mutate("trainjobs", tj["metadata"]["namespace"], tj["metadata"]["name"], put)


def suspend_job(job: Obj, suspend: bool) -> None:
    job["spec"]["suspend"] = suspend


def owner(tj: Obj) -> Obj:
    return controller_ref(tj, API_VERSION, "TrainJob")


def any_condition(status: Obj, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or []
    )


def pod_template(tj: Obj, base: Obj, labels: dict[str, str]) -> Obj:
    """The runtime's pod template with the TrainJob's trainer fields and patches applied."""
    name = tj["metadata"]["name"]
    trainer = tj["spec"].get("trainer") or {}
    template = copy.deepcopy(base)
    meta = template.setdefault("metadata", {})
    spec = template.setdefault("spec", {})
    spec["subdomain"] = name  # JobSet's enableDNSHostnames (default on)
    # JobSet's defaulting webhook: a failed container restarts in its pod, and its restarts
    # count against the child Job's backoffLimit (``pkg/webhooks/jobset_webhook.go``, Default).
    spec.setdefault("restartPolicy", "OnFailure")
    for patch in tj["spec"].get("runtimePatches") or []:
        apply_patch(meta, spec, patch)
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    node = next(c for c in spec["containers"] if c["name"] == NODE)
    for key in ("image", "command", "args"):
        if key in trainer:
            node[key] = trainer[key]
    nodes = int(trainer.get("numNodes") or 1)
    per_node = trainer.get("numProcPerNode", "auto")
    pet: list[Obj] = [
        {"name": "PET_NNODES", "value": str(nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(per_node)},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
        {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
    ]
    node["env"] = merge(merge(node.get("env") or [], trainer.get("env") or []), pet)
    node["ports"] = merge(
        node.get("ports") or [], [{"containerPort": TRAINER_PORT}], "containerPort"
    )
    resources = node.setdefault("resources", {})
    resources.update(copy.deepcopy(trainer.get("resourcesPerNode") or {}))
    claims = trainer.get("resourceClaimsPerNode") or []
    if claims:
        spec["resourceClaims"] = merge(spec.get("resourceClaims") or [], claims)
        refs = [{"name": c["name"]} for c in claims]
        resources["claims"] = merge(resources.get("claims") or [], refs)
    return template


def apply_patch(meta: Obj, spec: Obj, patch: Obj) -> None:
    """One ``runtimePatches`` entry's pod part for the ``node`` replicated job."""
    jobs = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
        "replicatedJobs"
    ) or []
    for job in jobs:
        if job.get("name") != NODE:
            continue
        pod = ((job.get("template") or {}).get("spec") or {}).get("template") or {}
        pmeta, pspec = pod.get("metadata") or {}, pod.get("spec") or {}
        for key in ("labels", "annotations"):
            if pmeta.get(key):
                meta[key] = {**(meta.get(key) or {}), **pmeta[key]}
        for key in ("affinity", "tolerations", "nodeSelector", "securityContext"):
            if key in pspec:
                spec[key] = copy.deepcopy(pspec[key])
        if "serviceAccountName" in pspec:
            spec["serviceAccountName"] = pspec["serviceAccountName"]
        spec["volumes"] = merge(spec.get("volumes") or [], pspec.get("volumes") or [])
        for patch_c in pspec.get("containers") or []:
            target = next(c for c in spec["containers"] if c["name"] == patch_c["name"])
            for key in ("env", "volumeMounts"):
                target[key] = merge(target.get(key) or [], patch_c.get(key) or [])
            if "securityContext" in patch_c:
                target["securityContext"] = copy.deepcopy(patch_c["securityContext"])


def merge(old: list[Obj], new: list[Obj], key: str = "name") -> list[Obj]:
    """A list map merged by ``key``: new entries replace old ones of that key, in place."""
    out = {item[key]: item for item in old}
    out |= {item[key]: copy.deepcopy(item) for item in new}
    return list(out.values())


def crd_objects(claims_per_node: bool) -> list[Obj]:
    """The TrainJob and ClusterTrainingRuntime CRDs as installed and established; the TrainJob's
    schema shows ``spec.trainer.resourceClaimsPerNode`` only on a Trainer of v2.4.0 or later."""
    trainer_fields = ["image", "command", "args", "env", "numNodes", "numProcPerNode"]
    trainer_fields += ["resourcesPerNode"] + (["resourceClaimsPerNode"] if claims_per_node else [])
    trainer = {"type": "object", "properties": {f: {} for f in trainer_fields}}
    spec = {"type": "object", "properties": {"trainer": trainer}}
    schema = {"type": "object", "properties": {"spec": spec}}
    out: list[Obj] = []
    for plural, kind, scope in (
        ("trainjobs", "TrainJob", "Namespaced"),
        ("clustertrainingruntimes", "ClusterTrainingRuntime", "Cluster"),
    ):
        version: Obj = {"name": "v1alpha1", "served": True, "storage": True}
        if plural == "trainjobs":
            version |= {"subresources": {"status": {}}, "schema": {"openAPIV3Schema": schema}}
        names = {"plural": plural, "singular": kind.lower(), "kind": kind}
        established = {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}
        out.append(
            {
                "metadata": {"name": f"{plural}.trainer.kubeflow.org"},
                "spec": {"group": "trainer.kubeflow.org", "scope": scope, "names": names},
                "status": {"conditions": [established], "acceptedNames": names},
            }
        )
        out[-1]["spec"]["versions"] = [version]
    return out


def torch_distributed_runtime() -> Obj:
    """The ``torch-distributed`` ClusterTrainingRuntime Trainer's Helm chart installs
    (``charts/kubeflow-trainer/files/runtimes/torch-distributed.yaml``): one node, the torch
    policy, no failure policy (no restarts)."""
    container = {"name": NODE, "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}
    pod = {"spec": {"containers": [container]}}
    node = {
        "name": NODE,
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"template": pod},
        },
    }
    return {
        "metadata": {
            "name": "torch-distributed",
            "labels": {"trainer.kubeflow.org/framework": "torch"},
        },
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [node]}},
        },
    }


def install(store: Store, claims_per_node: bool) -> None:
    """Trainer's Helm chart installed: its CRDs and the ``torch-distributed`` runtime."""
    for crd in crd_objects(claims_per_node):
        store.create("customresourcedefinitions", crd)
    store.create("clustertrainingruntimes", torch_distributed_runtime())
