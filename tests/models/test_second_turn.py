"""Every family in the registry: a second turn that resends the first turn's prompt and answer gives
transformers' greedy tokens and reads the first turn's whole blocks from the prefix cache."""

import json
import os

import pytest

from nanovllm.models.families import FAMILIES

from helpers.family_checks import assert_second_turn_matches_transformers
from helpers.family_models import FAMILY_MODELS


def test_every_family_in_the_registry_has_a_tiny_model():
    # a family registered without a tiny model here fails this, so the checks below cannot silently cover fewer
    assert set(FAMILY_MODELS) == set(FAMILIES)


@pytest.mark.parametrize("architecture", sorted(FAMILIES))
def test_a_second_turn_matches_transformers_and_reads_the_first_from_the_prefix_cache(tmp_path, architecture):
    model_dir = FAMILY_MODELS[architecture](tmp_path / "model")
    with open(os.path.join(model_dir, "config.json")) as f:
        assert json.load(f)["architectures"] == [architecture]
    assert_second_turn_matches_transformers(model_dir)
