"""Property tests of the plan's invariants over random valid layouts (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_operator.api import MegatronJobSpec, SpecError
from megatron_operator.core.planner import Plan, plan

from .specs import spec_of


@st.composite
def layouts(draw: st.DrawFn) -> Plan:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    cp = draw(st.sampled_from([1, 2]))
    ppn = draw(st.sampled_from([x for x in (1, 2, 4, 8) if x % tp == 0]))
    dp = draw(st.integers(1, 6))
    world = tp * pp * cp * dp
    if world % ppn:
        dp *= ppn
        world *= ppn
    nodes = world // ppn
    moe = draw(st.booleans())
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if (tp * cp * dp) % e == 0])) if moe else 1
    changes: dict[str, Any] = {
        "model": {
            "numLayers": 12 * pp,
            "hiddenSize": 64 * tp,
            "numAttentionHeads": 8 * tp,
            "numQueryGroups": tp,
            "vocabSize": 1000,
            "seqLength": 64 * cp,
            **({"moe": {"numExperts": 4 * ep, "routerTopK": 2}} if moe else {}),
        },
        "parallelism": {
            "tensor": tp,
            "pipeline": pp,
            "context": cp,
            "expert": ep,
            "expertTensor": 1 if moe else tp,
            "sequenceParallel": tp > 1,
        },
        "resources": {"nodes": nodes, "procsPerNode": ppn, "gpuMemoryGiB": 4096.0},
        "training": {"globalBatchSize": 4 * dp, "trainIters": 10},
    }
    spec = MegatronJobSpec.model_validate(spec_of(changes))
    try:
        return plan(spec)
    except SpecError as exc:  # pragma: no cover - the strategy only builds valid layouts
        raise AssertionError(f"strategy built an invalid layout: {exc}") from exc


PROPS = settings(max_examples=150, deadline=None)


@PROPS
@given(layouts())
def test_every_rank_appears_once_with_right_node(p: Plan) -> None:
    ranks = p.ranks()
    assert [c.rank for c in ranks] == list(range(p.world_size))
    for c in ranks:
        assert c.node == c.rank // p.procs_per_node
        assert c.local_rank == c.rank % p.procs_per_node


@PROPS
@given(layouts())
def test_coordinates_give_back_the_rank(p: Plan) -> None:
    d = p.degrees
    for c in p.ranks():
        assert 0 <= c.tp < d.tp and 0 <= c.cp < d.cp and 0 <= c.dp < d.dp and 0 <= c.pp < d.pp
        assert p.rank_of(c.tp, c.cp, c.dp, c.pp) == c.rank
        assert p.expert_rank_of(c.etp, c.ep, c.edp, c.pp) == c.rank


@PROPS
@given(layouts())
def test_group_sizes_and_partition(p: Plan) -> None:
    d = p.degrees
    sizes = {"tp": d.tp, "cp": d.cp, "dp": d.dp, "pp": d.pp, "etp": d.etp, "ep": d.ep, "edp": d.edp}
    for dim, size in sizes.items():
        groups = {tuple(p.group(r, dim)) for r in range(p.world_size)}  # type: ignore[arg-type]
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(p.world_size))  # a partition


@PROPS
@given(layouts())
def test_groups_are_the_same_set_from_any_member(p: Plan) -> None:
    for dim in ("tp", "dp", "pp", "cp", "ep", "edp"):
        for r in range(p.world_size):
            g = p.group(r, dim)  # type: ignore[arg-type]
            assert r in g
            for other in g:
                assert p.group(other, dim) == g  # type: ignore[arg-type]


@PROPS
@given(layouts())
def test_tp_groups_sit_inside_one_node(p: Plan) -> None:
    for r in range(0, p.world_size, p.degrees.tp):
        assert len({p.coord(x).node for x in p.group(r, "tp")}) == 1


@PROPS
@given(layouts())
def test_dp_group_varies_only_dp(p: Plan) -> None:
    for r in range(p.world_size):
        c = p.coord(r)
        for other in p.group(r, "dp"):
            o = p.coord(other)
            assert (o.tp, o.cp, o.pp) == (c.tp, c.cp, c.pp)


def test_degrees_and_batches_match_megatron_formulas() -> None:
    spec = MegatronJobSpec.model_validate(
        spec_of(
            {
                "model.recipe": "llama3-70b",
                "parallelism": {
                    "tensor": 8,
                    "pipeline": 4,
                    "virtualPipeline": 5,
                    "sequenceParallel": True,
                },
                "resources": {"nodes": 16, "procsPerNode": 8},
                "training": {"globalBatchSize": 1024, "microBatchSize": 1, "trainIters": 10},
            }
        )
    )
    p = plan(spec).to_dict(include_ranks=False)
    assert p["worldSize"] == 128
    assert p["data"] == 4
    assert p["numMicrobatches"] == 256
    assert p["paddedVocabSize"] == 129024  # ceil(128256 / 1024) * 1024
    assert p["layout"] == "TP8·PP4·VPP5·DP4"
    assert 60e9 < p["memory"]["parametersTotal"] < 80e9
