"""Ray's `/api/v0/nodes` answer is read field by field with its type checked: a field of another type than Ray
sends (`state_message`, `start_time_ms`, `end_time_ms`, `resources_total` and its `GPU`) is read as absent (None,
or 0 GPUs) and the node is still listed. Before, such a value was copied into the status (which a client then could
not read: `ClusterNode` fields are typed) or raised an internal error out of the view instead of a ClusterViewError.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from lynxtop.agent.cluster.view import ClusterViewError, parse_nodes
from lynxtop.contract.status import ClusterNode

pytestmark = pytest.mark.timeout(60)

GOOD = {"node_id": "a" * 56, "node_ip": "192.0.2.2", "node_name": "192.0.2.2", "is_head_node": True,
        "state": "DEAD", "state_message": "gone", "resources_total": {"GPU": 8.0},
        "start_time_ms": 1796288178717, "end_time_ms": 1796288196119}


def page(**row) -> dict:
    return {"result": True, "data": {"result": {"result": [{**GOOD, **row}]}}}


@pytest.mark.parametrize("row, field, expected", [
    ({"state_message": {"reason": "x"}}, "state_message", None),
    ({"state_message": 7}, "state_message", None),
    ({"start_time_ms": "1796288178717"}, "start_ms", None),
    ({"start_time_ms": 1.5}, "start_ms", None),
    ({"start_time_ms": True}, "start_ms", None),
    ({"end_time_ms": [1]}, "end_ms", None),
    ({"end_time_ms": "0"}, "end_ms", None),
    ({"resources_total": [["GPU", 8]]}, "gpus", 0.0),
    ({"resources_total": "GPU:8"}, "gpus", 0.0),
    ({"resources_total": {"GPU": "8"}}, "gpus", 0.0),
    ({"resources_total": {"GPU": [8]}}, "gpus", 0.0),
    ({"resources_total": {"GPU": 10**400}}, "gpus", 0.0),
    ({"resources_total": {"GPU": float("nan")}}, "gpus", 0.0),
    ({"resources_total": None}, "gpus", 0.0),
], ids=lambda v: json.dumps(v, default=str)[:40] if isinstance(v, dict) else str(v))
def test_a_field_of_another_type_is_absent_and_the_node_still_listed(row, field, expected):
    (node,) = parse_nodes(page(**row))
    assert getattr(node, field) == expected
    assert node.node_id == GOOD["node_id"] and node.head and not node.alive
    assert ClusterNode.from_json(json.loads(json.dumps(dataclasses.asdict(node)))) == node  # a client reads it back


def test_well_typed_fields_are_read_as_before():
    (node,) = parse_nodes(page())
    assert (node.state_message, node.start_ms, node.end_ms, node.gpus) == ("gone", 1796288178717, 1796288196119, 8.0)


@pytest.mark.parametrize("rows", [5, "nodes", None])
def test_a_node_list_of_another_type_is_a_view_error(rows):
    with pytest.raises(ClusterViewError, match="unexpected shape"):
        parse_nodes({"result": True, "data": {"result": {"result": rows}}})
