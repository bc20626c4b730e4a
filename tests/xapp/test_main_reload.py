"""pallas-xapp: a descriptor reload keeps live A1 instances and the --scheme override."""

import json
import os
import threading
from pathlib import Path

from xapp.a1 import A1PolicyHandler, default_policy_type_path, load_policy_type
from xapp.config import load_config_file
from xapp.main import DescriptorWatch, _reloaded, _watch_config, _with_scheme

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


# --- Kubernetes ConfigMap reload (field case, docs/osc.md
# §3.2): the kubelet swaps a ..data symlink to a new directory; the new file may keep the old
# modification time. Family: any change of content that times do not show.
def _configmap(tmp_path, doc: dict, name: str, mtime: float):
    d = tmp_path / name
    d.mkdir()
    f = d / "config-file.json"
    f.write_text(json.dumps(doc))
    os.utime(f, (mtime, mtime))
    return d


def _swap_data_link(tmp_path, target):
    """Atomically point ..data at ``target``, as the kubelet's AtomicWriter does."""
    tmp = tmp_path / "..data_tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, tmp_path / "..data")


class _Reconfigured(_App):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.applied = threading.Event()

    def reconfigure(self, cfg):
        self.config = cfg
        self.applied.set()


def test_a_configmap_swap_that_keeps_the_mtime_is_applied(tmp_path):
    doc = json.loads(DESC.read_text())
    t0 = 1_700_000_000.0
    _swap_data_link(tmp_path, _configmap(tmp_path, doc, "..2026_11_30_a", t0))
    (tmp_path / "config-file.json").symlink_to("..data/config-file.json")
    path = str(tmp_path / "config-file.json")
    app = _Reconfigured(load_config_file(path))
    done = threading.Event()
    th = _watch_config(path, app, None, done, None, 0.05)
    try:
        doc["controls"]["scheduler"]["t_max_s"] = 2.5
        _swap_data_link(tmp_path, _configmap(tmp_path, doc, "..2026_11_30_b", t0))
        assert os.stat(path).st_mtime == t0
        assert app.applied.wait(3.0), "the new content was never applied"
        assert app.config.scheduler.t_max_s == 2.5
    finally:
        done.set()
        th.join(2.0)


def test_the_watch_reports_content_changes_only(tmp_path):
    f = tmp_path / "c.json"
    f.write_text("{}")
    w = DescriptorWatch(str(f))
    assert w.changed() is None
    os.utime(f, (1.0, 1.0))                     # a new time, the same content: nothing to do
    assert w.changed() is None
    st = os.stat(f)
    f.write_text("[]")                          # new content, the old times
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert w.changed() == b"[]" and w.changed() is None
    f.unlink()                                  # gone for a moment: retried, nothing reported
    assert w.changed() is None
    f.write_text("[]")
    assert w.changed() is None
