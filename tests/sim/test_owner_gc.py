"""Backstop for skipped exit handlers: a domain owned by its launcher pod goes with the pod."""

from __future__ import annotations

import sys

from kubernetes import client, config

from mnnvl import steps
from mnnvl.inputs.names import RunNames
from mnnvl.inputs.spec import DomainSpec
from mnnvl.sim import SimCluster


def test_domain_owned_by_the_launcher_pod_is_collected_when_the_pod_is_deleted(
    monkeypatch, eventually
):
    run_id = "owned-run"
    with SimCluster(nodes=1) as sim:
        core = client.CoreV1Api(
            config.new_client_from_config(config_file=sim.admin_kubeconfig_path)
        )
        launcher = core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": "launcher"},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "command": [sys.executable, "-c", "import time; time.sleep(60)"],
                        }
                    ]
                },
            },
        )
        monkeypatch.setenv("POD_NAME", "launcher")
        monkeypatch.setenv("POD_NAMESPACE", "default")
        result = steps.provision(
            DomainSpec(run_id=run_id), kubeconfig=sim.kubeconfig_path, owner_pod=True
        )
        selector = RunNames.for_run(run_id).selector
        domain = sim.store.find("computedomains", "default", result.domain)
        assert domain is not None
        owners = domain["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [
            ("Pod", "launcher", launcher.metadata.uid)
        ]

        core.delete_namespaced_pod("launcher", "default")  # e.g. a run terminated hard
        eventually(lambda: not sim.objects(selector), what="the run's objects collected")
        assert sim.store.find("computedomains", "default", result.domain) is None
        assert sim.store.find("resourceclaimtemplates", "default", result.channel_template) is None
