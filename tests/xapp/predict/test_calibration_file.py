"""The xApp's predictor maps raw scores through the calibration tables of
``association_map.calibration`` (what ``pallas_tools.evaluate --save-calibration`` writes)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from xapp.app import PallasXapp
from xapp.config import from_descriptor
from xapp.predict import Calibrator, load_calibrators

REPO = Path(__file__).resolve().parents[3]


def _descriptor() -> dict:
    return json.loads((REPO / "descriptors" / "config-file.json").read_text())


def _tables(tmp_path: Path) -> Path:
    # raw scores < 0.5 are right 10% of the time, >= 0.5 70%: what evaluate's fit would save
    rng = np.random.default_rng(1)
    s = rng.uniform(0, 1, 4000)
    y = rng.uniform(0, 1, 4000) < np.where(s < 0.5, 0.1, 0.7)
    tabs = {m: Calibrator().fit(s.tolist(), y.tolist()).to_dict() for m in ("combined", "combined@2", "combined@3")}
    f = tmp_path / "cal.json"
    f.write_text(json.dumps(tabs))
    return f


def test_descriptor_key_reaches_the_predictors_calibrators(tmp_path):
    f = _tables(tmp_path)
    d = _descriptor()
    d["controls"]["association_map"]["calibration"] = str(f)
    cfg = from_descriptor(d)
    assert cfg.calibration_path == str(f)
    p = PallasXapp._build_predictor(cfg, None)
    cal = p.combined.calibrator
    assert cal.fitted
    assert cal(0.2) < 0.2 and cal(0.9) < 0.9 and abs(cal(0.2) - 0.1) < 0.05 and abs(cal(0.9) - 0.7) < 0.05
    assert all(c.fitted for c in p.combined.rank_calibrators)
    # without the key the raw scores pass unchanged
    p0 = PallasXapp._build_predictor(dataclasses.replace(cfg, calibration_path=""), None)
    assert not p0.combined.calibrator.fitted and p0.combined.calibrator(0.2) == 0.2


@pytest.mark.parametrize("body, match", [
    ("not json", "cannot read"),
    ("[1, 2]", "non-empty JSON object"),
    ("{}", "non-empty JSON object"),
    ('{"combined": 3}', "is not an object"),
    ('{"combined": {"edges": [null, null], "values": [0.1, 0.2]}}', "len\\(edges\\)"),
])
def test_bad_tables_are_one_clear_error(tmp_path, body, match):
    f = tmp_path / "cal.json"
    f.write_text(body)
    with pytest.raises(ValueError, match=match):
        load_calibrators(str(f))


def test_missing_and_oversized_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        load_calibrators(str(tmp_path / "absent.json"))
    big = tmp_path / "big.json"
    big.write_text("{" + " " * (1 << 20) + "}")
    with pytest.raises(ValueError, match="larger than 1 MiB"):
        load_calibrators(str(big))


def test_xapp_refuses_to_start_on_bad_calibration(tmp_path):
    from xapp.main import StartRefused, build_parser, build_xapp

    d = _descriptor()
    d["controls"]["association_map"]["calibration"] = str(tmp_path / "absent.json")
    cfgf = tmp_path / "config.json"
    cfgf.write_text(json.dumps(d))
    trace = tmp_path / "t.e2trace"
    trace.write_bytes(b"")
    a = build_parser().parse_args(["--mode", "test", "--config", str(cfgf), "--trace", str(trace),
                                   "--insecure", "--store", "memory"])
    with pytest.raises(StartRefused, match=r"^calibration: cannot read .*absent\.json"):
        build_xapp(from_descriptor(d), "test", a)
