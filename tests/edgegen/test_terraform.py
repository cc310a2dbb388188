"""Terraform output: provider v5 syntax, HCL escaping, and the same rules as the JSON."""

from __future__ import annotations

import json

import hcl_subset
import pytest
from edge_support import PLANS, golden_policy
from hypothesis import given
from hypothesis import strategies as st

import edgegen
from edgegen.compiler import _terraform


@pytest.mark.parametrize("plan", PLANS)
def test_terraform_has_the_same_rules_as_the_json(plan: str) -> None:
    """Parsing ratelimit.tf back gives exactly the rules of http_ratelimit.json."""
    artifacts = edgegen.build(golden_policy(plan))
    files = artifacts.files()
    body = json.loads(files["cloudflare/http_ratelimit.json"])
    parsed = hcl_subset.parse(files["terraform/ratelimit.tf"])
    [(labels, resource)] = parsed["resource"]
    assert labels == ("cloudflare_ruleset", _terraform.RESOURCE_NAME)
    assert resource["zone_id"] == hcl_subset.Reference("var.zone_id")
    assert resource["kind"] == "zone"
    assert resource["phase"] == "http_ratelimit"
    assert resource["description"] == body["description"]
    assert resource["rules"] == body["rules"]
    [(var_labels, variable)] = parsed["variable"]
    assert var_labels == ("zone_id",)
    assert variable["type"] == hcl_subset.Reference("string")
    [(_, terraform)] = parsed["terraform"]
    [(_, providers)] = terraform["required_providers"]
    assert providers["cloudflare"]["source"] == "cloudflare/cloudflare"
    assert providers["cloudflare"]["version"].startswith("~> 5")


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("plain", '"plain"'),
        ('"q"', '"\\"q\\""'),
        ("a\\b", '"a\\\\b"'),
        ("${var.x}", '"$${var.x}"'),
        ("%{ if }", '"%%{ if }"'),
        ("$$${", '"$$$${"'),
        ("$ and %", '"$ and %"'),
        ("line\nnext", '"line\\nnext"'),
        ("\u2028", '"\\u2028"'),
        ("ünï", '"ünï"'),
    ],
)
def test_hcl_string_escapes(value: str, written: str) -> None:
    """Quotes, backslashes, template sequences and newlines are escaped as HCL expects."""
    assert _terraform.hcl_string(value) == written
    assert hcl_subset.parse(f"x = {written}\n")["x"] == value


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"])))
def test_any_string_round_trips(value: str) -> None:
    """Whatever the string, HCL reads back exactly what was written."""
    assert hcl_subset.parse(f"x = {_terraform.hcl_string(value)}\n")["x"] == value


def test_bare_template_sequences_are_not_in_the_subset() -> None:
    """The test parser refuses ${ and %{, so an unescaped one cannot slip through."""
    with pytest.raises(hcl_subset.HclError):
        hcl_subset.parse('x = "${oops}"\n')
    with pytest.raises(hcl_subset.HclError):
        hcl_subset.parse('x = "%{oops}"\n')
