"""Plan and state files as declared formats: models with a version, and published JSON Schemas.

The schemas in docs/schemas/ are generated from the models (``edgegen.zone._file_formats``).
After an intended change of a format, regenerate them with ``UPDATE_GOLDEN=1 pytest
tests/test_file_formats.py`` and review the diff like any other change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest

import edgegen
from edgegen.errors import ZoneError
from edgegen.zone import _file_formats

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "docs" / "schemas"
EXAMPLE = ROOT / "examples" / "policy.yaml"
ZONE_STATE = ROOT / "examples" / "zone-state.json"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
ENV = {
    "CLOUDFLARE_ZONE_ID": "0123456789abcdef0123456789abcdef",
    "CLOUDFLARE_ACCOUNT_ID": "fedcba9876543210fedcba9876543210",
}


@pytest.mark.parametrize("name", sorted(_file_formats.schemas()))
def test_the_published_schemas_are_the_generated_ones(name: str) -> None:
    """docs/schemas/NAME is exactly what the model generates (UPDATE_GOLDEN=1 writes it)."""
    text = _file_formats.schemas()[name]
    path = SCHEMAS / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == text, f"{path} differs; UPDATE_GOLDEN=1 makes it"
    schema = json.loads(text)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def example_plan() -> dict[str, Any]:
    """The plan file of the example policy against the example zone state."""
    state = edgegen.load_state(ZONE_STATE)
    made = edgegen.plan(edgegen.build(policy.load(EXAMPLE, env=ENV)), state)
    return _file_formats.plan_to_json(made)


def properties(schema: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The properties of the schema's root, or of one of its definitions."""
    return (schema if name is None else schema["$defs"][name])["properties"]


def test_the_schemas_describe_the_files_edgegen_writes() -> None:
    """Each field a plan or state file holds is in its schema, with its version; each field
    the schema requires is written."""
    plan_schema = json.loads(_file_formats.schemas()["plan.schema.json"])
    plan = example_plan()
    assert set(plan) == set(properties(plan_schema))
    assert set(plan_schema["required"]) <= set(plan)
    assert properties(plan_schema)["format_version"]["const"] == plan["format_version"] == 2
    assert set(plan["writes"]) == set(properties(plan_schema, "Writes"))
    assert set(plan["writes"]["worker"]) == set(properties(plan_schema, "WorkerArtifact"))
    hashes = properties(plan_schema)["writes_sha256"]
    assert set(plan["writes_sha256"]) == set(hashes["properties"]) == set(hashes["required"])
    assert set(plan["rules"][0]) == set(properties(plan_schema, "RuleChange"))
    state_schema = json.loads(_file_formats.schemas()["state.schema.json"])
    state = _file_formats.state_to_json(edgegen.load_state(ZONE_STATE))
    assert set(state) == set(properties(state_schema))
    assert properties(state_schema)["format_version"]["const"] == state["format_version"] == 1
    assert state["worker"] is not None
    assert set(state["worker"]) == set(properties(state_schema, "RemoteWorker"))


def test_files_round_trip() -> None:
    """A plan and a state written and read back are the same values."""
    plan = example_plan()
    read = _file_formats.plan_from_json(json.loads(json.dumps(plan)), "p")
    again = _file_formats.plan_to_json(read)
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(plan))
    state = edgegen.load_state(ZONE_STATE)
    data = json.loads(json.dumps(_file_formats.state_to_json(state)))
    assert _file_formats.state_from_json(data, str(ZONE_STATE)) == state


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d["rules"][0].update(position="1"), 'rules[0].position is "1": input should'),
        (lambda d: d["rules"][0].update(action="explode"), 'rules[0].action is "explode"'),
        (lambda d: d["worker"].update(replaces_foreign="yes"), "worker.replaces_foreign is"),
        (lambda d: d["scope"].pop("zone_id"), "scope.zone_id is missing"),
        (lambda d: d["rules"][0]["fields"][0].pop("path"), "rules[0].fields[0].path is missing"),
        (lambda d: d["writes"]["ruleset"].update(rules={}), "writes.ruleset.rules is {}"),
    ],
)
def test_a_plan_file_is_read_by_its_model(edit: Any, says: str) -> None:
    """Every field has its JSON type (numbers and booleans are never read from strings);
    the first thing wrong is named by its place in the file."""
    data = example_plan()
    edit(data)
    data["writes_sha256"] = _file_formats.write_hashes(data["writes"], data["routes"])
    with pytest.raises(ZoneError, match=r"plan\.json is not a usable edgegen plan file") as info:
        _file_formats.plan_from_json(json.loads(json.dumps(data)), "plan.json")
    assert says in str(info.value)


def test_a_state_file_is_read_by_its_model() -> None:
    """A state file's fields have their JSON types; what older files leave out (a ruleset's
    description, the Worker's bindings, the URL normalisation setting) has its default, and
    a null generated_by_edgegen is false, as such files always were read."""
    data = json.loads(ZONE_STATE.read_text())
    data["routes"] = [{"id": "r1", "pattern": "a.example.com/*", "script": 5}]
    with pytest.raises(ZoneError, match=r"routes\[0\]\.script is 5"):
        _file_formats.state_from_json(data, "s")
    data = json.loads(ZONE_STATE.read_text())
    data["worker"]["generated_by_edgegen"] = "true"
    with pytest.raises(ZoneError, match=r"worker\.generated_by_edgegen"):
        _file_formats.state_from_json(data, "s")
    data["worker"]["generated_by_edgegen"] = None
    del data["worker"]["bindings"]
    del data["ruleset"]["description"]
    del data["url_normalization"]
    state = _file_formats.state_from_json(data, "s")
    assert state.worker is not None and not state.worker.generated_by_edgegen
    assert state.worker.bindings == ()
    assert state.ruleset is not None and state.ruleset.description == ""
    assert state.notices and "holds no URL normalisation setting" in state.notices[0]
