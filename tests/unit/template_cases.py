"""spec.template cases shared by the unit parity test (the models against the CRD's CEL,
tests/unit/test_template.py) and the real apiserver (tests/integration/test_operator_open_pods.py).

Each refused case sets one operator-owned field through the template; `field` is the path both
`mjob validate` and the apiserver must name (the apiserver's path may go deeper, e.g. into a
list item), and `why` a word of the reason both give.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.unit.specs import spec_of

# Everything a platform team puts in a template, accepted by both: a data claim, a Multus
# annotation, an image pull secret, an env var from a Secret, a native sidecar and a plain one.
FULL_TEMPLATE: dict[str, Any] = {
    "metadata": {
        "labels": {"team": "pretraining"},
        "annotations": {"k8s.v1.cni.cncf.io/networks": "ib-sriov"},
    },
    "spec": {
        "volumes": [
            {
                "name": "datasets",
                "persistentVolumeClaim": {"claimName": "lustre", "readOnly": True},
            },
            {"name": "scratch", "emptyDir": {}},
            {
                "name": "tokens",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"audience": "vault", "path": "vault-token"}},
                        {"configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca"}]}},
                    ]
                },
            },
        ],
        "initContainers": [
            {
                "name": "log-shipper",
                "image": "fluent/fluent-bit:3.1",
                "restartPolicy": "Always",
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }
        ],
        "containers": [
            {
                "name": "trainer",
                "env": [
                    {
                        "name": "WANDB_API_KEY",
                        "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}},
                    },
                    {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                ],
                "envFrom": [{"configMapRef": {"name": "team-settings"}}],
                "volumeMounts": [
                    {"name": "datasets", "mountPath": "/datasets", "readOnly": True},
                    {"name": "scratch", "mountPath": "/scratch"},
                ],
                # (the apiserver wants a memory or cpu entry beside hugepages)
                "resources": {
                    "requests": {"hugepages-2Mi": "1Gi", "memory": "8Gi"},
                    "limits": {"hugepages-2Mi": "1Gi", "memory": "8Gi"},
                },
            },
            {
                "name": "metrics-exporter",
                "image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5",
                "ports": [{"containerPort": 9400, "name": "metrics"}],
                "readinessProbe": {
                    "httpGet": {"path": "/health", "port": "metrics", "scheme": "HTTP"},
                    "periodSeconds": 10,
                },
                "livenessProbe": {"tcpSocket": {"port": 9400}, "failureThreshold": 3},
                "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 1"]}}},
                "securityContext": {
                    "runAsUser": 2000,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            },
        ],
        "imagePullSecrets": [{"name": "registry-creds"}],
        "nodeSelector": {"example.com/pool": "h100"},
        "affinity": {
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": {"team": "pretraining"}},
                            "topologyKey": "topology.kubernetes.io/zone",
                        },
                    }
                ]
            },
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "example.com/healthy", "operator": "In", "values": ["true"]}
                            ]
                        }
                    ]
                }
            },
        },
        "tolerations": [{"key": "example.com/reserved", "operator": "Exists"}],
        "schedulerName": "default-scheduler",
        "runtimeClassName": "nvidia",
        "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
        "securityContext": {
            "supplementalGroups": [4242],
            "sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}],
        },
    },
}


@dataclass(frozen=True)
class Refused:
    id: str
    template: dict[str, Any]
    field: str  # the path both name (a prefix of the apiserver's)
    why: str  # a word of the reason both give

    def spec(self) -> dict[str, Any]:
        return spec_of({"template": self.template})


def _trainer(**fields: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "trainer", **fields}]}}


def _init(**fields: Any) -> dict[str, Any]:
    return {"spec": {"initContainers": [{"name": "setup", "image": "busybox:1", **fields}]}}


_INIT = "spec.template.spec.initContainers[0]"
_TERM = {"labelSelector": {"matchLabels": {"x": "y"}}, "topologyKey": "kubernetes.io/os"}
_RESTRICTED = "restricted Pod Security level"

# What the restricted Pod Security level forbids, in any container of the pods or the pod itself,
# and pod affinity terms over other namespaces: refused whatever the namespace's level.
HOSTILE: list[Refused] = [
    Refused("privileged init", _init(securityContext={"privileged": True}),
            f"{_INIT}.securityContext", _RESTRICTED),
    Refused("root init", _init(securityContext={"runAsUser": 0}),
            f"{_INIT}.securityContext", _RESTRICTED),
    Refused("runAsNonRoot false", _init(securityContext={"runAsNonRoot": False}),
            f"{_INIT}.securityContext", _RESTRICTED),
    Refused("privilege escalation", _init(securityContext={"allowPrivilegeEscalation": True}),
            f"{_INIT}.securityContext", _RESTRICTED),
    Refused("SYS_ADMIN", _init(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}),
            f"{_INIT}.securityContext.capabilities", "NET_BIND_SERVICE and IPC_LOCK"),
    Refused("unmasked proc", _init(securityContext={"procMount": "Unmasked"}),
            f"{_INIT}.securityContext", _RESTRICTED),
    Refused("container seccomp Unconfined",
            _init(securityContext={"seccompProfile": {"type": "Unconfined"}}),
            f"{_INIT}.securityContext.seccompProfile", _RESTRICTED),
    Refused("SELinux spc_t", _init(securityContext={"seLinuxOptions": {"type": "spc_t"}}),
            f"{_INIT}.securityContext.seLinuxOptions", _RESTRICTED),
    Refused("hostPort", _init(ports=[{"containerPort": 80, "hostPort": 80}]),
            f"{_INIT}.ports[0]", _RESTRICTED),
    Refused("Bidirectional",
            _init(volumeMounts=[{"name": "x", "mountPath": "/x",
                                 "mountPropagation": "Bidirectional"}]),
            f"{_INIT}.volumeMounts[0]", _RESTRICTED),
    Refused("probe to another host",
            _init(restartPolicy="Always",
                  livenessProbe={"httpGet": {"port": 80, "host": "10.0.0.1"}}),
            f"{_INIT}.livenessProbe.httpGet", "host"),
    Refused("pod seccomp Unconfined",
            {"spec": {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}},
            "spec.template.spec.securityContext.seccompProfile", _RESTRICTED),
    Refused("pod root", {"spec": {"securityContext": {"runAsUser": 0}}},
            "spec.template.spec.securityContext", _RESTRICTED),
    Refused("pod runAsNonRoot false", {"spec": {"securityContext": {"runAsNonRoot": False}}},
            "spec.template.spec.securityContext", _RESTRICTED),
    Refused("unsafe sysctl",
            {"spec": {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}},
            "spec.template.spec.securityContext.sysctls[0]", _RESTRICTED),
    Refused("anti-affinity over every namespace",
            {"spec": {"affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {**_TERM, "namespaceSelector": {}}]}}}},
            "spec.template.spec.affinity.podAntiAffinity."
            "requiredDuringSchedulingIgnoredDuringExecution[0]", "own namespace"),
    Refused("affinity to another namespace",
            {"spec": {"affinity": {"podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "podAffinityTerm": {**_TERM, "namespaces": ["team-b"]}}]}}}},
            "spec.template.spec.affinity.podAffinity."
            "preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm", "own namespace"),
    Refused("trainer mount path not normal",
            _trainer(volumeMounts=[{"name": "x", "mountPath": "//etc/megatron"}]),
            "spec.template.spec.containers[0]", "normal form"),
]  # fmt: skip

REFUSED: list[Refused] = [
    *[
        Refused(f"pod {f}", {"spec": {f: v}}, f"spec.template.spec.{f}", "operator")
        for f, v in (
            ("restartPolicy", "OnFailure"),
            ("hostname", "mine"),
            ("subdomain", "mine"),
            ("serviceAccountName", "admin"),
            ("serviceAccount", "admin"),
            ("nodeName", "node-1"),
            ("terminationGracePeriodSeconds", 5),
            ("priorityClassName", "high"),
        )
    ],
    *[
        Refused(
            f"volume {v}",
            {"spec": {"volumes": [{"name": v, "emptyDir": {}}]}},
            "spec.template.spec.volumes[0]",
            "operator",
        )
        for v in ("config", "checkpoints", "dshm", "megatron-data", "megatron-init")
    ],
    *[
        Refused(
            f"mount path {p}",
            _trainer(volumeMounts=[{"name": "x", "mountPath": p}]),
            "spec.template.spec.containers[0]",
            "mounts",
        )
        for p in (
            "/etc/megatron",
            "/mnt/checkpoints",
            "/mnt/checkpoints/sub",
            "/dev/shm",
            "/mnt/data",
            "/mnt/init/",
        )
    ],
    Refused(
        "mount of an owned volume",
        _trainer(volumeMounts=[{"name": "checkpoints", "mountPath": "/elsewhere"}]),
        "spec.template.spec.containers[0]",
        "mounts",
    ),
    *[
        Refused(
            f"env {name}",
            _trainer(env=[{"name": name, "value": "1"}]),
            "spec.template.spec.containers[0]",
            "operator",
        )
        for name in (
            "RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "LOCAL_RANK",
            "NODE_RANK",
            "MEGATRON_CONFIG",
            "MEGATRON_ANYTHING",
        )
    ],
    *[
        Refused(
            f"trainer {f}",
            _trainer(**{f: v}),
            "spec.template.spec.containers[0]",
            why,
        )
        for f, v, why in (
            ("command", ["bash"], "trainer.command"),
            ("args", ["--x"], "trainer.args"),
            ("image", "evil:1", "spec.image"),
            ("imagePullPolicy", "Always", "spec.imagePullPolicy"),
            ("securityContext", {"readOnlyRootFilesystem": True}, "operator"),
            ("ports", [{"containerPort": 1}], "operator"),
            ("workingDir", "/tmp", "operator"),
        )
    ],
    Refused(
        "trainer GPU count",
        _trainer(resources={"limits": {"nvidia.com/gpu": "16"}}),
        "spec.template.spec.containers[0]",
        "procsPerNode",
    ),
    *[
        Refused(
            f"label {k}",
            {"metadata": {"labels": {k: "x"}}},
            "spec.template.metadata.labels",
            "operator",
        )
        for k in ("megatron.dev/job-name", "megatron.dev/node-rank", "kueue.x-k8s.io/queue-name")
    ],
    Refused(
        "annotation megatron.dev/layout",
        {"metadata": {"annotations": {"megatron.dev/layout": "TP1"}}},
        "spec.template.metadata.annotations",
        "operator",
    ),
    Refused(
        "trainer as an init container",
        {"spec": {"initContainers": [{"name": "trainer", "image": "x:1"}]}},
        "spec.template.spec.initContainers",
        "trainer",
    ),
    Refused(
        "sidecar without an image",
        {"spec": {"containers": [{"name": "helper"}]}},
        "spec.template.spec.containers[0]",
        "image",
    ),
    Refused(
        "env with a value and valueFrom",
        _trainer(
            env=[
                {
                    "name": "X",
                    "value": "1",
                    "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                }
            ]
        ),
        "spec.template.spec.containers[0].env[0]",
        "valueFrom",
    ),
    *HOSTILE,
]


def heavy_template(values: int, size: int) -> dict[str, Any]:
    """A template of about `values` JSON values and `size` bytes that the CRD accepts: the most
    objects per byte it allows (sidecars with env entries of one-letter values), then one long
    annotation. The heaviest a pod can get within a given budget, for memory tests and
    benchmarks/operator_template_memory.py."""
    containers: list[dict[str, Any]] = []
    left = values - 8
    while left > 0 and len(containers) < 16:
        n = min(256, max(1, (left - 6) // 3))
        env = [{"name": f"E{i}", "value": "v"} for i in range(n)]
        containers.append({"name": f"s{len(containers)}", "image": "x:1", "env": env})
        left -= 3 * n + 6
    template: dict[str, Any] = {"spec": {"containers": containers}}
    pad = size - len(json.dumps(template, separators=(",", ":")))
    annotations: dict[str, str] = {}
    while pad > 100:  # each annotation value within the CRD's cap of 65,536
        chunk = min(pad - 64, 60_000)
        annotations[f"example.com/pad{len(annotations)}"] = "x" * chunk
        pad -= chunk + 64
    if annotations:
        template["metadata"] = {"annotations": annotations}
    return template
