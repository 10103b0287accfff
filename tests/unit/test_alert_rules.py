"""The chart's PrometheusRule, evaluated by Prometheus's own rule engine (`promtool test rules`)
over synthetic series: each alert fires when it should and stays silent when it should not.

promtool comes from `tests/cluster/cluster promtool` (one on PATH, a cached one, Debian's package
fetched with apt-get, else built from its Go module); helm renders the rule from the chart, with the chart's default thresholds.
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from .chartkit import ROOT, one, render


@cache
def promtool() -> str:
    proc = subprocess.run(
        [str(ROOT / "tests" / "cluster" / "cluster"), "promtool"],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    paths = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    if proc.returncode != 0 or "promtool" not in paths:
        pytest.fail(f"`tests/cluster/cluster promtool` failed:\n{proc.stderr[-3000:]}")
    return paths["promtool"]


def series(metric: str, values: str, **labels: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{metric}{{{inner}}}", "values": values}


@cache
def annotations() -> dict[str, dict[str, str]]:
    """Each alert's annotations as the chart renders them (with their $labels templates)."""
    rule = one(render("alerts.enabled=true"), "PrometheusRule")
    return {
        r["alert"]: r["annotations"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    }


def expanded(alert: str, labels: dict[str, str]) -> dict[str, str]:
    """The annotations Prometheus gives a firing alert: $labels filled in."""
    out = {}
    for key, template in annotations()[alert].items():
        text = template
        for name, value in labels.items():
            text = text.replace("{{ $labels." + name + " }}", value)
        out[key] = text
    return out


def firing(alert: str, at: str, *labelsets: dict[str, str]) -> dict[str, Any]:
    return {
        "eval_time": at,
        "alertname": alert,
        "exp_alerts": [
            {
                "exp_labels": {**labels, "severity": sev(alert)},
                "exp_annotations": expanded(alert, labels),
            }
            for labels in labelsets
        ],
    }


def silent(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


def sev(alert: str) -> str:
    return "critical" if alert == "MegatronOperatorNotReady" else "warning"


def job(name: str) -> dict[str, str]:
    return {"namespace": "team", "name": name}


# Prometheus's test clock starts at 0, so a Unix time of 0 is "the start of the test"; values
# are one sample per minute (interval 1m): '0+60x60' is the time itself, minute by minute.
NO_PROGRESS = [
    # a: Running since t=0, never reported; hangTimeoutSeconds 1800, so idle past 900 s fires.
    series("megatronjob_running_since_timestamp_seconds", "0x60", **job("a")),
    series("megatronjob_hang_timeout_seconds", "1800x60", **job("a")),
    # b: Running and reporting every minute: silent.
    series("megatronjob_running_since_timestamp_seconds", "0x60", **job("b")),
    series("megatronjob_progress_timestamp_seconds", "0+60x60", **job("b")),
    series("megatronjob_hang_timeout_seconds", "1800x60", **job("b")),
    # c: the hang rule off (0): idle past noProgressSeconds (1800) fires.
    series("megatronjob_running_since_timestamp_seconds", "0x60", **job("c")),
    series("megatronjob_hang_timeout_seconds", "0x60", **job("c")),
    # d: an old report, but the attempt restarted at 20 min: idle counts from the restart.
    series("megatronjob_running_since_timestamp_seconds", "_x19 1200x40", **job("d")),
    series("megatronjob_progress_timestamp_seconds", "0x60", **job("d")),
    series("megatronjob_hang_timeout_seconds", "1800x60", **job("d")),
    # e: not Running (no running-since series): silent, however old its last report.
    series("megatronjob_progress_timestamp_seconds", "0x60", **job("e")),
    series("megatronjob_hang_timeout_seconds", "1800x60", **job("e")),
]
NO_PROGRESS_TESTS = [
    silent("MegatronJobNoProgress", "14m"),
    firing("MegatronJobNoProgress", "16m", job("a")),
    # d restarted at 20 min: 16 min idle again only at 36 min (and a at once, c past 30 min).
    firing("MegatronJobNoProgress", "31m", job("a"), job("c")),
    firing("MegatronJobNoProgress", "36m", job("a"), job("c"), job("d")),
]

RESTARTS = [
    # The counter exists at 0 from the job's first sight: the first restart is an increase.
    series("megatronjob_restarts_total", "0 0 0 1 1 1 1 1 1 1 1", reason="Hang", **job("h")),
    series("megatronjob_restarts_total", "0x10", reason="Error", **job("h")),
    # Four restarts within the hour fire MegatronJobRestarting (threshold 3); one does not.
    series("megatronjob_restarts_total", "0 1 2 3 4 4 4 4 4 4 4", reason="Error", **job("r")),
    series("megatronjob_restarts_total", "0 0 1 1 1 1 1 1 1 1 1", reason="NodeLost", **job("s")),
]
RESTART_TESTS = [
    silent("MegatronJobHang", "2m"),
    firing("MegatronJobHang", "4m", job("h")),
    silent("MegatronJobRestarting", "3m"),
    firing("MegatronJobRestarting", "5m", job("r")),
]

PENDING = [
    series("megatronjob_phase", "1x30", phase="Pending", **job("p")),
    series("megatronjob_phase", "1x10 0x20", phase="Pending", **job("q")),
]
PENDING_TESTS = [
    silent("MegatronJobPending", "10m"),
    firing("MegatronJobPending", "20m", {**job("p"), "phase": "Pending"}),
]


def operator(ready: str, leader: str, pod: str) -> list[dict[str, str]]:
    return [
        series("megatron_operator_ready", ready, pod=pod),
        series("megatron_operator_leader", leader, pod=pod),
    ]


def operator_tests() -> list[dict[str, Any]]:
    healthy = {
        "interval": "1m",
        # A ready leader and a ready standby: silent.
        "input_series": [*operator("1x20", "1x20", "a"), *operator("1x20", "0x20", "b")],
        "alert_rule_test": [silent("MegatronOperatorNotReady", "15m")],
    }
    standby_only = {
        "interval": "1m",
        # The leader's last scrape is at 1 min (its series go stale 5 min later, at 6 min); the
        # standby stays ready but does not lead: fires operatorNotReadyFor (5m) after that.
        "input_series": [*operator("1 1 _x18", "1 1 _x18", "a"), *operator("1x20", "0x20", "b")],
        "alert_rule_test": [
            silent("MegatronOperatorNotReady", "5m"),
            silent("MegatronOperatorNotReady", "10m"),
            firing("MegatronOperatorNotReady", "13m", {}),
        ],
    }
    nothing = {
        "interval": "1m",
        "input_series": [series("up", "1x20", job="other")],
        "alert_rule_test": [firing("MegatronOperatorNotReady", "9m", {})],
    }
    return [healthy, standby_only, nothing]


@pytest.fixture(scope="module")
def rule_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rule = one(render("alerts.enabled=true"), "PrometheusRule")
    path = tmp_path_factory.mktemp("rules") / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def run_tests(rule_file: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    test_file = rule_file.parent / "tests.yml"
    test_file.write_text(
        yaml.safe_dump(
            {"rule_files": [rule_file.name], "evaluation_interval": "1m", "tests": tests}
        )
    )
    return subprocess.run(
        [promtool(), "test", "rules", test_file.name],
        cwd=rule_file.parent,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_every_alert_fires_when_it_should_and_is_silent_otherwise(rule_file: Path) -> None:
    tests = [
        {"interval": "1m", "input_series": NO_PROGRESS, "alert_rule_test": NO_PROGRESS_TESTS},
        {"interval": "1m", "input_series": RESTARTS, "alert_rule_test": RESTART_TESTS},
        {"interval": "1m", "input_series": PENDING, "alert_rule_test": PENDING_TESTS},
        *operator_tests(),
    ]
    proc = run_tests(rule_file, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rules = {
        r["alert"]
        for g in yaml.safe_load(rule_file.read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    tested = {t["alertname"] for case in tests for t in case["alert_rule_test"]}
    assert tested == rules  # every alert of the chart, none forgotten


def test_the_evaluator_would_catch_a_wrong_expectation(rule_file: Path) -> None:
    # The same machinery fails when an expectation is wrong: the checks above can fail.
    wrong = [{"interval": "1m", "input_series": NO_PROGRESS, "alert_rule_test": [
        firing("MegatronJobNoProgress", "14m", job("a"))
    ]}]  # fmt: skip
    proc = run_tests(rule_file, wrong)
    assert proc.returncode != 0 and "MegatronJobNoProgress" in proc.stdout + proc.stderr


# Two jobs' ledgers, one sample a minute for two hours: job "fast" (8 GPUs, namespace a) is
# productive 54 of every 60 s; job "slow" (1,024 GPUs, namespace b) 30 of 60 s, the rest restarts.
GOODPUT = [
    series("megatronjob_goodput_seconds_total", "0+54x120", cause="productive", **job("fast")),
    series("megatronjob_goodput_seconds_total", "0+6x120", cause="startUp", **job("fast")),
    series("megatronjob_gpus", "8x120", **job("fast")),
    series(
        "megatronjob_goodput_seconds_total",
        "0+30x120",
        cause="productive",
        namespace="b",
        name="slow",
    ),
    series(
        "megatronjob_goodput_seconds_total",
        "0+30x120",
        cause="restartRecreate",
        namespace="b",
        name="slow",
    ),
    series("megatronjob_gpus", "1024x120", namespace="b", name="slow"),
]


def test_the_fleet_goodput_is_recorded(rule_file: Path) -> None:
    """The chart's recording rules over two jobs' ledgers: the fleet's goodput by job-seconds
    (0.7), weighted by GPUs (the big job's 50 % dominates), per namespace, and by cause."""
    weighted = (54 * 8 + 30 * 1024) / (60 * 8 + 60 * 1024)
    expect = [
        ("megatron:goodput:ratio_rate1h", [({}, 84 / 120)]),
        ("megatron:goodput_gpu_weighted:ratio_rate1h", [({}, weighted)]),
        (
            "namespace:megatronjob_goodput:ratio_rate1h",
            [({"namespace": "team"}, 0.9), ({"namespace": "b"}, 0.5)],
        ),
        (
            "cause:megatronjob_goodput_seconds:rate1h",
            [
                ({"cause": "productive"}, 84 / 60),
                ({"cause": "startUp"}, 0.1),
                ({"cause": "restartRecreate"}, 0.5),
            ],
        ),
    ]
    tests = [
        {
            "interval": "1m",
            "input_series": GOODPUT,
            "promql_expr_test": [
                {
                    "expr": name,
                    "eval_time": "90m",
                    "exp_samples": [
                        {
                            "labels": f"{name}{{{', '.join(f'{k}={v!r}'.replace(chr(39), chr(34)) for k, v in labels.items())}}}",
                            "value": value,
                        }
                        for labels, value in samples
                    ],
                }
                for name, samples in expect
            ],
        }
    ]
    proc = run_tests(rule_file, tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wrong = [
        {
            **tests[0],
            "promql_expr_test": [
                {
                    **tests[0]["promql_expr_test"][0],
                    "exp_samples": [{"labels": "megatron:goodput:ratio_rate1h", "value": 0.8}],
                }
            ],
        }
    ]
    assert run_tests(rule_file, wrong).returncode != 0  # the check can fail
