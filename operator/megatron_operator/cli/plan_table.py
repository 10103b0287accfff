"""Human-readable plan output for `mjob plan -o table` (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from megatron_operator.core.planner import Plan


def _ranks_of_node(plan: Plan, node: int) -> str:
    first = node * plan.procs_per_node
    last = first + plan.procs_per_node - 1
    return f"{first}–{last}" if last > first else str(first)


def print_plan(plan: Plan, max_nodes: int = 16, console: Console | None = None) -> None:
    out = console or Console()
    d, m = plan.degrees, plan.memory
    summary = Table(title=f"Plan: {plan.layout_string()}", show_header=False)
    summary.add_column("key", style="bold")
    summary.add_column("value")
    rows = [
        ("world size", f"{plan.world_size} = {plan.nodes} nodes × {plan.procs_per_node}"),
        ("tensor / pipeline / virtual", f"{d.tp} / {d.pp} / {d.vpp or '-'}"),
        ("context / expert / expert-tensor", f"{d.cp} / {d.ep} / {d.etp}"),
        ("data / expert-data", f"{d.dp} / {d.edp}"),
        ("sequence parallel", "yes" if d.sequence_parallel else "no"),
        ("Megatron FSDP", "yes" if d.fsdp else "no"),
    ]
    t = plan.training
    if t is not None:
        rows.append(
            (
                "batch",
                f"global {t.global_batch_size} = micro {t.micro_batch_size} × data {d.dp} "
                f"× {t.num_microbatches} microbatches",
            )
        )
        rows.append(("precision", t.precision))
    if plan.model is not None:
        rows.append(("padded vocab", str(plan.model.padded_vocab_size)))
    if m is not None:
        rows.append(
            (
                "parameters",
                f"{m.parameters_total / 1e9:.2f} B total, {m.parameters_per_gpu / 1e9:.2f} B "
                "per GPU",
            )
        )
        rows.append(
            (
                "memory per GPU",
                f"{m.per_gpu_gib:.1f} GiB (weights+optimizer {m.weights_and_optimizer_gib:.1f}, "
                f"activations {m.activations_gib:.1f}, overhead {m.overhead_gib:.1f}"
                + (
                    f"; {m.construction_gib:.1f} while FSDP builds the model"
                    if m.construction_gib
                    else ""
                )
                + ")",
            )
        )
    for key, value in rows:
        summary.add_row(key, value)
    out.print(summary)

    nodes = Table(title="Nodes → ranks (tp, cp, dp, pp of each rank)")
    for col in ("node", "ranks", "coordinates (tp,cp,dp,pp)"):
        nodes.add_column(col)
    for node in range(min(plan.nodes, max_nodes)):
        coords = [
            plan.coord(r)
            for r in range(node * plan.procs_per_node, (node + 1) * plan.procs_per_node)
        ]
        shown = " ".join(f"({c.tp},{c.cp},{c.dp},{c.pp})" for c in coords[:8])
        if len(coords) > 8:
            shown += " …"
        nodes.add_row(str(node), _ranks_of_node(plan, node), shown)
    if plan.nodes > max_nodes:
        nodes.add_row("…", f"{plan.nodes - max_nodes} more nodes", "(use -o json for all ranks)")
    out.print(nodes)
