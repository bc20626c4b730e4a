"""pallas-xapp: a descriptor reload keeps live A1 instances and the --scheme override."""

import json
from pathlib import Path

from xapp.a1 import A1PolicyHandler, default_policy_type_path, load_policy_type
from xapp.config import load_config_file
from xapp.main import _reloaded, _with_scheme

DESC = Path(__file__).resolve().parents[2] / "descriptors" / "config-file.json"


class _App:
    def __init__(self, cfg):
        self.config = cfg


def test_reload_reapplies_a1_instances_and_scheme_override():
    base = _with_scheme(load_config_file(str(DESC)), "ctho")
    assert base.scheme == "ctho"
    a1 = A1PolicyHandler(base, load_policy_type(default_policy_type_path(base.a1.policy_type_id)))
    req = {"operation": "CREATE", "policy_type_id": base.a1.policy_type_id,
           "policy_instance_id": "p1", "payload": {"alpha": 0.55}}
    assert json.loads(a1.handle(json.dumps(req)))["status"] == "OK"
    assert a1.config.scheduler.alpha == 0.55
    app = _App(a1.config)
    doc = json.loads(DESC.read_text())
    doc["controls"]["scheduler"]["t_max_s"] = 3.0          # the operator edits the descriptor
    new = _reloaded(doc, app, "ctho", a1)
    assert new is not None
    assert new.scheduler.t_max_s == 3.0                     # the new descriptor applies
    assert new.scheduler.alpha == 0.55                      # the live A1 instance survives
    assert new.scheme == "ctho"                             # so does the --scheme override
    bad = json.loads(DESC.read_text())
    bad["controls"]["scheduler"]["alpha"] = 7               # invalid: running config kept
    assert _reloaded(bad, _App(new), "ctho", a1) is None
