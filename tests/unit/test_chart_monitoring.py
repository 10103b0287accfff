"""The dashboard and the alerts query only metrics the operator exports and docs/metrics.md
documents; the dashboard is valid JSON with every panel the issue asks for."""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client import generate_latest

from megatron_operator.cluster.metrics import Metrics

from .chartkit import CHART, ROOT, of_kind, one, render

DASHBOARD = CHART / "dashboards" / "megatronjobs.json"
# PromQL words that are not metric names.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: strip strings, label matchers, ranges and
    grouping clauses; what is left that is not a function call or a keyword is a metric."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        word = match.group()
        if rest.startswith("(") or word in KEYWORDS or word.startswith("$"):
            continue
        if text[match.start() - 1 : match.start()] == "$":
            continue  # a Grafana variable such as $__rate_interval
        names.add(word)
    return names


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def all_rules() -> list[dict[str, Any]]:
    rule = one(render("alerts.enabled=true"), "PrometheusRule")
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return [r for r in all_rules() if "alert" in r]


def documented() -> set[str]:
    text = (ROOT / "docs" / "metrics.md").read_text()
    return set(re.findall(r"^\| `([a-z_:]+)` \|", text, flags=re.M))


def exported() -> set[str]:
    """Sample names a fresh operator's registry exposes (histograms as _bucket/_sum/_count)."""
    text = generate_latest(Metrics().registry).decode()
    names = set()
    for line in text.splitlines():
        match = re.match(r"# TYPE (\S+) (\S+)", line)
        if match:
            name, kind = match.groups()
            names.add(name)
            if kind == "histogram":
                names.update(name + s for s in HISTOGRAM_SUFFIXES)
            if kind == "counter" and not name.endswith("_total"):
                names.add(f"{name}_total")
    return names


def base(name: str) -> str:
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def test_metric_names_parser() -> None:
    expr = 'histogram_quantile(0.9, sum by (le) (rate(a_bucket{x="y"}[$__rate_interval]))) - b and on (n) c{phase="Running"} == 1'
    assert metric_names(expr) == {"a_bucket", "b", "c"}


def test_dashboard_has_every_panel() -> None:
    board = dashboard()
    assert board["uid"] and board["panels"]
    titles = {p["title"] for p in board["panels"]}
    for title in (
        "Jobs by phase",
        "Restarts by reason (per hour)",
        "Restarts by rung (per hour)",
        "Time to Running",
        "Iteration",
        "Tokens per second",
        "MFU",
        "Loss",
        "Checkpoint age",
        "Reconcile latency",
    ):
        assert title in titles
    for title in (
        "Goodput",
        "Fleet goodput (last hour)",
        "Wall time by cause (last hour)",
        "Forecast: time to the last step",
    ):
        assert title in titles
    for panel in board["panels"]:
        assert panel["type"] == "row" or panel["targets"], panel["title"]
    rows = [p for p in board["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows] == ["Goodput"]


def test_dashboard_configmap_carries_the_sidecar_label_and_the_json() -> None:
    (cm,) = [
        c
        for c in of_kind(render("dashboard.enabled=true"), "ConfigMap")
        if c["metadata"]["name"].endswith("-dashboard")
    ]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["megatronjobs.json"]) == dashboard()


def test_alerts_cover_the_issue_and_use_the_thresholds() -> None:
    names = {r["alert"] for r in alert_rules()}
    assert names == {
        "MegatronJobPending",
        "MegatronJobRestarting",
        "MegatronJobNoProgress",
        "MegatronJobHang",
        "MegatronOperatorNotReady",
    }
    custom = one(
        render("alerts.enabled=true", "alerts.restartThreshold=7", "alerts.pendingFor=2h"),
        "PrometheusRule",
    )
    rules = {r["alert"]: r for g in custom["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert rules["MegatronJobRestarting"]["expr"].endswith("> 7")
    assert rules["MegatronJobPending"]["for"] == "2h"


def test_every_queried_metric_is_documented_and_exported() -> None:
    queried = set()
    for expr in [*dashboard_exprs(), *(r["expr"] for r in all_rules())]:  # and the records
        queried |= metric_names(expr)
    assert queried, "no metric found in the queries"
    docs, names = documented(), exported()
    for name in sorted(queried):
        assert base(name) in docs, f"{name} is queried but not documented in docs/metrics.md"
        assert name in names, f"{name} is queried but the operator does not export it"
    # And the other way: every documented metric exists.
    for name in sorted(docs):
        assert name in names, f"docs/metrics.md documents {name}, which is not exported"
