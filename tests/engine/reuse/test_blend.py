"""Recompute selection: first k, top-r deviation, validation; KV deviation on tensors."""

from __future__ import annotations

import re

import pytest
import torch

from suffixmem.engine.reuse.blend import (
    DEFAULT_BLEND,
    BlendConfig,
    combine_deviations,
    default_blend,
    gate_passed,
    kv_deviation,
    select_attended,
    select_recompute,
)
from suffixmem.errors import ConfigError


def test_first_k_only() -> None:
    assert select_recompute(10, BlendConfig(first_k=3, ratio=0.0)) == [0, 1, 2]
    assert select_recompute(2, BlendConfig(first_k=3, ratio=0.0)) == [0, 1]
    assert select_recompute(10, BlendConfig(first_k=0, ratio=0.0)) == []


def test_top_r_picks_the_most_deviating_beyond_first_k() -> None:
    dev = [9.0, 0.1, 0.5, 3.0, 0.2, 2.0, 0.0, 2.0, 0.3, 0.4]
    # 20% of 10 = 2 tokens beyond the first k = 1; offset 0 is taken by first k already
    assert select_recompute(10, BlendConfig(first_k=1, ratio=0.2), dev) == [0, 3, 5]
    # ties go to the earlier offset
    assert select_recompute(10, BlendConfig(first_k=1, ratio=0.3), dev) == [0, 3, 5, 7]
    assert select_recompute(10, BlendConfig(first_k=0, ratio=1.0), dev) == list(range(10))


def test_top_r_needs_one_deviation_per_token() -> None:
    with pytest.raises(ValueError):
        select_recompute(10, BlendConfig(first_k=1, ratio=0.2))
    with pytest.raises(ValueError):
        select_recompute(10, BlendConfig(first_k=1, ratio=0.2), [1.0] * 9)


def test_num_deviating_never_exceeds_the_rest() -> None:
    cfg = BlendConfig(first_k=8, ratio=0.5)
    assert cfg.num_deviating(10) == 2
    assert cfg.num_deviating(100) == 50
    assert not BlendConfig(ratio=0.0).needs_check and cfg.needs_check


@pytest.mark.parametrize(
    "kwargs",
    [{"first_k": -1}, {"first_k": 1.5}, {"ratio": 1.5}, {"ratio": -0.1}, {"check_layers": ()},
     {"check_layers": (-1,)}, {"full_layers": -1}, {"full_layers": True},
     {"query_ratio": 1.01}, {"query_ratio": -0.5}, {"query_ratio": float("nan")}],
)
def test_config_is_validated(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        BlendConfig(**kwargs)


def test_check_layers_are_sorted_and_unique() -> None:
    assert BlendConfig(check_layers=(3, 1, 3)).check_layers == (1, 3)


def test_fresh_depth_and_label() -> None:
    assert BlendConfig(first_k=16).fresh_depth == 0 and BlendConfig(16).label() == "k16"
    top = BlendConfig(first_k=16, ratio=0.3, check_layers=(1, 4))
    assert top.fresh_depth == 5 and top.label() == "k16-r0.3@1,4"
    deep = BlendConfig(first_k=0, ratio=0.15, full_layers=8)
    assert deep.fresh_depth == 8 and deep.label() == "k0-r0.15@1-L8"
    # the check layers count only when a check runs
    assert BlendConfig(check_layers=(6,), full_layers=2).fresh_depth == 2
    # query-aware recompute drafts over every layer after placement: no fresh layers of its own
    query = BlendConfig(first_k=16, query_ratio=0.1)
    assert query.fresh_depth == 0 and query.label() == "k16-q0.1"
    both = BlendConfig(first_k=4, ratio=0.2, query_ratio=0.05, full_layers=2)
    assert both.label() == "k4-r0.2@1-q0.05-L2"
    assert BlendConfig(first_k=16, query_ratio=0.1, query_patch=True).label() == "k16-p0.1"


def test_parse_reads_every_label_back_and_names_a_bad_one() -> None:
    for config in (BlendConfig(16), BlendConfig(16, 0.3, (1, 4)),
                   BlendConfig(0, 0.15, full_layers=8),
                   BlendConfig(4, 0.2, query_ratio=0.05, full_layers=2),
                   BlendConfig(16, query_ratio=0.1, query_patch=True)):
        assert BlendConfig.parse(config.label()) == config
    for bad, why in (("q0.4", "expected a label"), ("k16-q1.5", "query_ratio must be in"),
                     ("k16-r0.3.1@1", "0.3.1")):
        with pytest.raises(ConfigError, match=rf"segment reuse method '{re.escape(bad)}'.*{why}"):
            BlendConfig.parse(bad)


def test_select_attended_takes_the_most_attended_positions() -> None:
    positions = [40, 41, 42, 50, 51, 60]
    mass = [0.1, 2.0, 0.3, 2.0, 0.0, 5.0]
    assert select_attended(positions, mass, 2) == [41, 60]
    assert select_attended(positions, mass, 3) == [41, 50, 60]  # tie 41/50: both fit
    assert select_attended(positions, [1.0] * 6, 2) == [40, 41]  # ties: the earlier position
    assert select_attended(positions, mass, 0) == []
    assert select_attended(positions, mass, 99) == positions
    with pytest.raises(ValueError, match="need 6 attention values"):
        select_attended(positions, mass[:5], 2)
    # follow: each pick brings the candidates right after it (not past a gap), within ``want``
    assert select_attended(positions, mass, 4, follow=1) == [41, 42, 50, 60]
    assert select_attended(positions, mass, 2, follow=3) == [41, 60]
    assert select_attended(positions, [0, 0, 0, 0, 0, 1.0], 3, follow=2) == [40, 41, 60]


def test_kv_deviation_ranks_the_perturbed_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    k = torch.randn(6, 3, 8, generator=g)
    v = torch.randn(6, 3, 8, generator=g)
    k2, v2 = k.clone(), v.clone()
    k2[4] += 1.0
    v2[1] -= 3.0
    dev = kv_deviation(k, v, k2, v2)
    assert dev.shape == (6,)
    assert torch.equal(dev[[0, 2, 3, 5]], torch.zeros(4))
    assert dev[1] > dev[4] > 0
    assert torch.equal(kv_deviation(k, v, k, v), torch.zeros(6))


def test_combine_deviations_weighs_layers_alike() -> None:
    a = torch.tensor([1.0, 0.0, 2.0])
    b = torch.tensor([0.0, 300.0, 0.0])
    out = combine_deviations([a, b])
    assert torch.allclose(out, torch.tensor([1.0, 3.0, 2.0]))
    with pytest.raises(ValueError):
        combine_deviations([])


def test_a_class_is_on_by_default_only_where_its_method_passed_in_that_dtype() -> None:
    # the default method passed the rag gate in fp32 (57 of 59), not in bf16 (50 of 59)
    assert gate_passed("rag", DEFAULT_BLEND, "float32")
    assert not gate_passed("rag", DEFAULT_BLEND, "bfloat16")
    # k16-q0.4 passed in bf16 on two hosts and missed on a third (52 of 59; chained 0.91)
    assert not gate_passed("rag", BlendConfig(first_k=16, query_ratio=0.4), "bfloat16")
    # k16 alone missed everywhere; unmeasured pairs and classes count as failed
    assert not gate_passed("rag", BlendConfig(first_k=16, ratio=0.0), "float32")
    assert not gate_passed("rag", BlendConfig(first_k=16, query_ratio=0.4), "float32")
    assert not gate_passed("documents", DEFAULT_BLEND, "float32")


def test_the_default_method_is_the_one_whose_gate_passed_in_the_served_dtype() -> None:
    assert default_blend("float32") == DEFAULT_BLEND
    assert default_blend("bfloat16").label() == "k16-q0.4"
    # fp32's passed the rag gate; bf16's did not everywhere, so bf16 turns stay exact
    assert gate_passed("rag", default_blend("float32"), "float32")
    assert not gate_passed("rag", default_blend("bfloat16"), "bfloat16")
    # a dtype never measured: the fallback, and no gate passed
    assert default_blend("float16") == DEFAULT_BLEND
    assert not gate_passed("rag", default_blend("float16"), "float16")
