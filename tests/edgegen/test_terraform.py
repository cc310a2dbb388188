"""Terraform output: provider v5 syntax, HCL escaping, and the same rules as the JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import hcl_subset
import pytest
from edge_support import PLANS, golden_policy
from hypothesis import given
from hypothesis import strategies as st

import edgegen
from edgegen.compiler import _terraform

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))


def _module(artifacts: edgegen.Artifacts) -> dict[str, Any]:
    """The module's HCL parsed back; resources by type."""
    assert artifacts.terraform is not None
    return hcl_subset.parse(artifacts.terraform)


def _check_module(artifacts: edgegen.Artifacts) -> None:
    """The module holds exactly what the JSON ruleset and the Worker artifact hold."""
    files = artifacts.files()
    body = json.loads(files["cloudflare/http_ratelimit.json"])
    parsed = _module(artifacts)
    resources = dict(parsed["resource"])
    resource = resources[("cloudflare_ruleset", _terraform.RESOURCE_NAME)]
    assert resource["zone_id"] == hcl_subset.Reference("var.zone_id")
    assert resource["kind"] == "zone"
    assert resource["phase"] == "http_ratelimit"
    assert resource["description"] == body["description"]
    # The user's rules first, edgegen's last: the provider owns the whole phase.
    assert resource["rules"] == hcl_subset.Call(
        "concat",
        (hcl_subset.Reference("var.extra_rules"), hcl_subset.Reference("local.edgegen_rules")),
    )
    [(_, local)] = parsed["locals"]
    assert local["edgegen_rules"] == body["rules"]
    variables = {labels[0]: variable for labels, variable in parsed["variable"]}
    assert variables["zone_id"]["type"] == hcl_subset.Reference("string")
    assert variables["extra_rules"]["default"] == []
    [(_, terraform)] = parsed["terraform"]
    [(_, providers)] = terraform["required_providers"]
    assert providers["cloudflare"]["source"] == "cloudflare/cloudflare"
    assert providers["cloudflare"]["version"].startswith("~> 5")
    assert "owns the zone's whole http_ratelimit phase" in (artifacts.terraform or "")
    worker = artifacts.worker
    script = resources.get(("cloudflare_workers_script", _terraform.WORKER_RESOURCE_NAME))
    route = resources.get(("cloudflare_workers_route", _terraform.ROUTE_RESOURCE_NAME))
    if worker is None:
        assert script is None and route is None and "account_id" not in variables
        return
    assert script is not None
    assert variables["account_id"]["type"] == hcl_subset.Reference("string")
    assert script["account_id"] == hcl_subset.Reference("var.account_id")
    assert script["script_name"] == worker.name
    assert script["main_module"] == worker.main_module
    assert script["compatibility_date"] == worker.compatibility_date
    assert script["content"] == worker.module_source
    assert script["bindings"] == list(worker.bindings)
    assert all(b["type"] == "ratelimit" for b in script["bindings"])
    if not worker.routes:
        assert route is None
        return
    assert route is not None
    assert route["for_each"] == hcl_subset.Call("toset", (list(worker.routes),))
    assert route["zone_id"] == hcl_subset.Reference("var.zone_id")
    assert route["pattern"] == hcl_subset.Reference("each.value")
    assert route["script"] == hcl_subset.Reference(
        f"cloudflare_workers_script.{_terraform.WORKER_RESOURCE_NAME}.script_name"
    )


@pytest.mark.parametrize("plan", PLANS)
def test_terraform_has_the_same_rules_and_worker_as_the_json(plan: str) -> None:
    """Parsing ratelimit.tf back gives exactly the rules of http_ratelimit.json, after the
    user's own, and the Worker with its bindings and routes."""
    _check_module(edgegen.build(golden_policy(plan)))


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_policy_builds_a_module_that_stands_alone(name: str) -> None:
    """Each policy under examples/ builds a module that holds its rules and its Worker."""
    artifacts = edgegen.build(policy.load(ROOT / "examples" / name))
    assert artifacts.worker is not None
    _check_module(artifacts)


def test_an_app_only_policy_writes_no_module(tmp_path: Path) -> None:
    """No edge limit: no Terraform at all, and a module left by an earlier build goes."""
    edge = policy.loads(
        "version: 1\ncloudflare: { plan: pro }\nlimits:\n"
        "  - { name: x, match: { paths: [/x] }, edge: { rate: 5/10s } }\n"
    )
    edgegen.write(edgegen.build(edge), tmp_path)
    assert (tmp_path / "terraform" / "ratelimit.tf").is_file()
    app_only = policy.loads(
        "version: 1\ncloudflare: { plan: pro }\nlimits:\n"
        "  - { name: x, app: { tiers: { default: 5/1m } } }\n"
    )
    artifacts = edgegen.build(app_only)
    assert artifacts.terraform is None
    assert "terraform/ratelimit.tf" not in artifacts.files()
    edgegen.write(artifacts, tmp_path)
    assert not (tmp_path / "terraform" / "ratelimit.tf").exists()


@pytest.mark.skipif(shutil.which("terraform") is None, reason="the terraform CLI is not here")
@pytest.mark.parametrize("name", EXAMPLES)
def test_terraform_reads_the_module(name: str) -> None:
    """terraform fmt, which needs no provider, parses every example's module."""
    artifacts = edgegen.build(policy.load(ROOT / "examples" / name))
    result = subprocess.run(
        ["terraform", "fmt", "-"],
        input=artifacts.terraform,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


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
