"""MegatronJobDefaults (core/defaults.py): merged under the job's spec with the job's own rules,
recorded once, rendered; spec.activeDeadlineSeconds; the warnings of `mjob validate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from megatron_operator.cli.main import main
from megatron_operator.core.defaults import (
    DEFAULT_TRAINER_IMAGE,
    Layer,
    Platform,
    apply,
    platform,
    resolve,
)
from megatron_operator.core.planner import plan
from megatron_operator.core.render import render

from .sim import Sim
from .specs import DELETE, job_of, spec_of

ROOT = Path(__file__).resolve().parents[2]

PLATFORM: dict[str, Any] = {
    "image": "registry.example/ml/trainer:2",
    "imagePullPolicy": "Always",
    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "TEAM", "value": "platform"}],
    "resources": {
        "requests": {"cpu": "8", "memory": "64Gi"},
        "nodeSelector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "network": {"fabric": "efa", "devices": 4},
    },
    "template": {
        "metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "efa-net"}},
        "spec": {
            "imagePullSecrets": [{"name": "regcred"}],
            "containers": [{"name": "trainer", "env": [{"name": "FI_LOG", "value": "warn"}]}],
        },
    },
    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/t"}},
    "podSecurityContext": {},
}


def test_the_job_wins_every_conflict_and_inherits_the_rest() -> None:
    record, errors = resolve([Layer("operator", {"image": "op:1"}), Layer("ns/p", PLATFORM)])
    assert errors == [] and record is not None
    assert record["sources"] == ["operator", "ns/p"]
    job = spec_of(
        {
            "env": [{"name": "TEAM", "value": "mine"}],
            "resources.requests": {"cpu": "2"},
            "resources.tolerations": [{"key": "spot", "operator": "Exists"}],
            "imagePullPolicy": "IfNotPresent",  # what the apiserver stores when left out
            "resources.network": {"fabric": "none", "devices": 1},  # likewise
            "template": {"spec": {"imagePullSecrets": [{"name": "mine"}]}},
        }
    )
    merged = apply(job, record["spec"])
    assert merged["image"] == "trainer:test"  # the job's own (BASE_SPEC names one)
    assert apply(spec_of({"image": DELETE}), record["spec"])["image"] == PLATFORM["image"]
    assert merged["imagePullPolicy"] == "Always"
    assert merged["env"] == [
        {"name": "NCCL_DEBUG", "value": "WARN"},
        {"name": "TEAM", "value": "mine"},
    ]
    assert merged["resources"]["requests"] == {"cpu": "2", "memory": "64Gi"}
    assert (
        merged["resources"]["nodes"] == 2 and merged["resources"]["nodeSelector"]["pool"] == "gpu"
    )
    assert [t["key"] for t in merged["resources"]["tolerations"]] == ["nvidia.com/gpu", "spot"]
    assert merged["resources"]["network"] == {"fabric": "efa", "devices": 4}
    assert merged["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mine"}]
    assert merged["template"]["spec"]["containers"][0]["env"] == [
        {"name": "FI_LOG", "value": "warn"}
    ]
    # A job that picks its own fabric keeps it whole.
    own = apply(spec_of({"resources.network": {"fabric": "infiniband"}}), record["spec"])
    assert own["resources"]["network"] == {"fabric": "infiniband"}
    # Fields only the defaults hold never reach the job's spec.
    assert "serviceAccount" not in merged and "podSecurityContext" not in merged
    job_of(merged)  # still a valid job


def test_the_more_specific_defaults_win_and_identity_is_taken_whole() -> None:
    op = {"image": "op:1", "podSecurityContext": {"runAsUser": 1000, "fsGroup": 1000}}
    record, _ = resolve([Layer("operator", op), Layer("ns/a", {"image": "ns:1"})])
    assert record is not None and record["spec"]["image"] == "ns:1"
    assert platform(record["spec"]) == Platform(run_as_user=1000, run_as_group=None, fs_group=1000)
    openshift, _ = resolve([Layer("operator", op), Layer("ns/a", {"podSecurityContext": {}})])
    assert openshift is not None
    assert platform(openshift["spec"]) == Platform(
        run_as_user=None, run_as_group=None, fs_group=None
    )
    assert platform({}) == Platform()  # none said: the images' user, 1000


def test_bad_defaults_are_named_by_source_and_field() -> None:
    record, errors = resolve(
        [Layer("team-a/gpu", {"podSecurityContext": {"runAsUser": 0}, "imag": "x"})]
    )
    assert record is None
    text = "; ".join(str(e) for e in errors)
    assert "MegatronJobDefaults team-a/gpu: spec.podSecurityContext.runAsUser" in text
    assert "spec.imag: unknown field; did you mean 'image'?" in text
    # Empty layers (what the CRD's own defaults leave) count for nothing.
    assert resolve([Layer("ns/empty", {"env": [], "resources": {"requests": {}}})]) == (None, [])


def test_the_pods_carry_the_defaults_and_only_what_they_say() -> None:
    record, _ = resolve([Layer("ns/p", PLATFORM)])
    assert record is not None
    job = job_of(apply(spec_of({"image": DELETE}), record["spec"]))
    objs = render(job, plan(job.spec), platform=platform(record["spec"]))
    pod = next(o for o in objs if o["kind"] == "Pod")
    account = next(o for o in objs if o["kind"] == "ServiceAccount")
    assert account["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/t"
    }
    # OpenShift: no fixed uid, gid or fsGroup (restricted-v2 assigns them); never root.
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = pod["spec"]["containers"][0]
    assert container["image"] == PLATFORM["image"]
    assert container["resources"]["requests"]["vpc.amazonaws.com/efa"] == "4"
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "efa-net"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    # Without defaults: the images' user, and the built-in image name.
    plain = job_of({"image": DELETE})
    bare = next(o for o in render(plain, plan(plain.spec)) if o["kind"] == "Pod")
    assert {k: bare["spec"]["securityContext"][k] for k in ("runAsUser", "fsGroup")} == {
        "runAsUser": 1000,
        "fsGroup": 1000,
    }
    assert bare["spec"]["containers"][0]["image"] == DEFAULT_TRAINER_IMAGE


def test_defaults_are_recorded_once_and_a_later_change_reaches_no_running_job() -> None:
    sim = Sim.of_spec(spec_of({"image": DELETE}))
    sim.defaults = (Layer("operator", {"image": "op:1"}), Layer("default/p", PLATFORM))
    sim.start_running()
    recorded = sim.status["defaults"]
    assert recorded["sources"] == ["operator", "default/p"]
    pod = next(iter(sim.pods.values()))
    assert pod["spec"]["containers"][0]["image"] == PLATFORM["image"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["NCCL_DEBUG"] == "WARN"
    # The platform changes its defaults: the running job's next attempt keeps what it recorded.
    sim.defaults = (Layer("default/p", {**PLATFORM, "image": "registry.example/ml/trainer:3"}),)
    first = next(iter(sim.pods))
    sim.fail(first)
    sim.settle(12)
    sim.run_all()
    sim.step()
    assert sim.status["restarts"] == 1 and sim.status["defaults"] == recorded
    assert {p["spec"]["containers"][0]["image"] for p in sim.pods.values()} == {PLATFORM["image"]}


def test_invalid_defaults_fail_the_job_naming_them_and_a_fix_revives_it() -> None:
    sim = Sim.of_spec(spec_of())
    sim.defaults = (Layer("default/bad", {"env": "NCCL_DEBUG=WARN"}),)
    sim.step()
    assert sim.status["phase"] == "Failed" and not sim.pods
    failed = next(c for c in sim.status["conditions"] if c["type"] == "Failed")
    assert "MegatronJobDefaults default/bad: spec.env" in failed["message"]
    sim.defaults = (Layer("default/bad", {"env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}),)
    sim.settle(3)
    assert sim.status["phase"] == "Pending" and sim.pods
    assert sim.status["defaults"]["sources"] == ["default/bad"]


def test_active_deadline_fails_the_job_with_its_reason_and_stops_the_pods() -> None:
    sim = Sim.of_spec(spec_of({"activeDeadlineSeconds": 600}))
    sim.start_running()
    out = sim.step()
    assert 0 < out.requeue_after <= 601  # it looks again at the deadline, not at the resync
    sim.tick(601)
    sim.step()
    st = sim.status
    assert st["phase"] == "Failed"
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert (
        failed["reason"] == "DeadlineExceeded"
        and "activeDeadlineSeconds (600 s)" in failed["message"]
    )
    assert all(p["metadata"].get("deletionTimestamp") for p in sim.pods.values())
    assert ("DeadlineExceeded", failed["message"]) in sim.events


def test_validate_warns_on_data_outside_the_volumes_bin_files_and_no_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    doc["spec"]["data"] = {
        "volume": {"claimName": "corpus"},
        "blend": [
            {"weight": 1.0, "prefix": "/data/fineweb/fineweb_text_document"},
            {"weight": 1.0, "prefix": "/mnt/data/code/code_text_document.bin"},
        ],
        "tokenizer": {"path": "/mnt/data/tokenizers/llama3"},
    }
    del doc["spec"]["resources"]["requests"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "is valid" in out
    warnings = [line for line in out.splitlines() if line.startswith("  warning: ")]
    assert len(warnings) == 3, out
    assert (
        "spec.data.blend[0].prefix: /data/fineweb/fineweb_text_document is not under a volume"
        in (warnings[0])
    )
    assert "/mnt/data (spec.data.volume)" in warnings[0]
    assert "spec.data.blend[1].prefix" in warnings[1] and "without .bin or .idx" in warnings[1]
    assert (
        "spec.resources.requests: no cpu or memory request: the pods are BestEffort"
        in (warnings[2])
    )
    # A MegatronJobDefaults that gives the requests answers the last one.
    defaults = tmp_path / "defaults.yaml"
    defaults.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "megatron.dev/v1alpha1",
                "kind": "MegatronJobDefaults",
                "metadata": {"name": "gpu"},
                "spec": {"resources": {"requests": {"cpu": "64", "memory": "900Gi"}}},
            }
        )
    )
    assert main(["validate", str(path), "--defaults", str(defaults)]) == 0
    assert "no cpu or memory request" not in capsys.readouterr().out


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_no_example_draws_a_warning(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(path)]) == 0
    assert "warning" not in capsys.readouterr().out


def test_render_shows_the_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    defaults = tmp_path / "d.yaml"
    defaults.write_text(json.dumps(PLATFORM))
    assert (
        main(["render", str(ROOT / "examples" / "cpu-tiny.yaml"), "--defaults", str(defaults)]) == 0
    )
    objs = yaml.safe_load(capsys.readouterr().out)["items"]
    pod = next(o for o in objs if o["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["image"] == PLATFORM["image"]
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_the_built_in_image_is_the_charts_default() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "megatron-operator" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts" / "megatron-operator" / "values.yaml").read_text())
    image = values["trainerImage"]
    assert f"{image['repository']}:{image['tag'] or chart['appVersion']}" == DEFAULT_TRAINER_IMAGE


def test_a_queue_labelled_job_waits_without_kueue_and_runs_once_unlabelled() -> None:
    from megatron_operator.core.reconcile import Settings

    sim = Sim.of_spec(spec_of())
    sim.settings = Settings(without_kueue=True)
    sim.job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    out = sim.step()
    st = sim.status
    admitted = next(c for c in st["conditions"] if c["type"] == "Admitted")
    assert st["phase"] == "Queued" and not sim.pods and out.create == []
    assert admitted["status"] == "False" and admitted["reason"] == "KueueDisabled"
    assert (
        "LocalQueue team-a" in admitted["message"]
        and "outside the queue's quota" in (admitted["message"])
    )
    assert out.requeue_after == float("inf")  # nothing to do until the job changes
    sim.step()
    assert [r for r, _ in sim.events].count("KueueDisabled") == 1  # said once
    del sim.job["metadata"]["labels"]
    sim.start_running()
    assert "Admitted" not in {c["type"] for c in sim.status["conditions"]}


def test_the_operator_can_require_a_queue_label() -> None:
    from megatron_operator.core.reconcile import Settings

    sim = Sim.of_spec(spec_of())
    sim.settings = Settings(require_queue=True)
    sim.step()
    admitted = next(c for c in sim.status["conditions"] if c["type"] == "Admitted")
    assert sim.status["phase"] == "Queued" and not sim.pods
    assert admitted["reason"] == "QueueLabelRequired"
    assert "kueue.x-k8s.io/queue-name" in admitted["message"]


def test_a_pod_level_root_uid_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "root.yaml"
    path.write_text((ROOT / "examples" / "cpu-tiny.yaml").read_text())
    argv = ["validate", str(path), "--set", "template.spec.securityContext={runAsUser: 0}"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "spec.template.spec.securityContext.runAsUser: runAsUser 0 (root) is refused" in err
    argv[-1] = "template.spec.securityContext={runAsUser: 4242, fsGroup: 4242}"
    assert main(argv) == 0


def test_preprocess_job_writes_to_the_data_claim_as_the_trainer_pods_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import kubernetes_validate

    defaults = tmp_path / "d.json"
    defaults.write_text(json.dumps(PLATFORM))
    args = ["--input", "/mnt/data/raw/a.jsonl", "/mnt/data/raw/b.jsonl"]
    args += ["--tokenizer", "/mnt/data/tokenizers/llama3", "--output-prefix=/mnt/data/fw/fw"]
    assert (
        main(["preprocess-job", "--claim", "corpus", "--defaults", str(defaults), "--", *args]) == 0
    )
    job = yaml.safe_load(capsys.readouterr().out)
    kubernetes_validate.validate(job, "1.34.0", strict=True)
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "megatron_trainer.preprocess", *args]
    assert c["image"] == PLATFORM["image"] and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert c["volumeMounts"] == [{"name": "data", "mountPath": "/mnt/data"}]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "corpus"}
    assert "runAsUser" not in pod["securityContext"]  # the platform's empty identity
    bad = [
        "--input",
        "/data/a.jsonl",
        "--tokenizer",
        "/mnt/data/t",
        "--output-prefix",
        "/mnt/data/x.bin",
    ]
    assert main(["preprocess-job", "--claim", "corpus", "--", *bad]) == 2
    err = capsys.readouterr().err
    assert "--input: /data/a.jsonl is not on the data claim" in err and "PREFIX.bin" in err


def test_mjob_status_names_the_defaults() -> None:
    from megatron_operator.cli.status import describe

    sim = Sim.of_spec(spec_of({"image": DELETE}))
    sim.defaults = (Layer("operator", {"image": "op:1"}), Layer("default/p", PLATFORM))
    sim.start_running()
    text = describe(sim.job, list(sim.pods.values()), [])
    assert (
        "defaults from operator, default/p: env, image, imagePullPolicy, podSecurityContext" in text
    )


def test_ipc_lock_can_be_left_to_a_runtime_that_raises_memlock() -> None:
    def caps(network: dict[str, Any], limits: dict[str, str]) -> dict[str, Any]:
        job = job_of({"resources.network": network, "resources.limits": limits})
        pod = next(o for o in render(job, plan(job.spec)) if o["kind"] == "Pod")
        got: dict[str, Any] = pod["spec"]["containers"][0]["securityContext"]["capabilities"]
        return got

    locked = {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert caps({"fabric": "infiniband"}, {}) == locked
    assert caps({}, {"rdma/ib": "1"}) == locked
    assert caps({"fabric": "infiniband", "ipcLock": False}, {}) == {"drop": ["ALL"]}
    assert caps({"ipcLock": False}, {"rdma/ib": "1"}) == {"drop": ["ALL"]}


def test_only_the_operators_defaults_name_the_launcher_image(tmp_path: Path) -> None:
    """The launcher image is the first code of every trainer.command pod: the operator's
    --job-defaults (a bare spec, as the chart writes it) may name it, a namespace's
    MegatronJobDefaults may not."""
    from megatron_operator.api import SpecError
    from megatron_operator.cli.common import read_defaults

    bare = tmp_path / "defaults.json"
    bare.write_text(json.dumps({"launcherImage": "registry.example/ops/operator:1"}))
    assert platform(read_defaults([str(bare)])).launcher_image == "registry.example/ops/operator:1"
    record, errors = resolve([Layer("operator", {"launcherImage": "a:1"})])
    assert record is not None and not errors
    obj = tmp_path / "team.yaml"
    obj.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "megatron.dev/v1alpha1",
                "kind": "MegatronJobDefaults",
                "metadata": {"name": "gpu", "namespace": "team"},
                "spec": {"launcherImage": "evil.example/launcher:1"},
            }
        )
    )
    with pytest.raises(SpecError, match="only the operator's own defaults"):
        read_defaults([str(obj)])
    record, errors = resolve([Layer("team/gpu", {"launcherImage": "evil.example/launcher:1"})])
    assert record is None and "spec.launcherImage" in str(errors[0])
