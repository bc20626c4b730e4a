"""Builders shared by the E2 tests (exposed as the ``e2`` fixture)."""

import math
import random
from types import SimpleNamespace

import pytest

from pallas_tools.tracegen import (encode_kpm_indication, encode_rc_message_copy, encode_ric_indication,
                                   encode_rrc_meas_report)
from xapp.e2.e2ap import RicIndication
from xapp.e2.ie import Cgi, Guami, UeId
from xapp.e2.rrc import CellResult, RrcMeasReport, ServingResult
from xapp.e2.sm_kpm import KpmIndication, KpmUeReport
from xapp.e2.sm_rc import RcMessageCopy

NAN = math.nan


def ue(n: int = 7, plmn: str = "00101") -> UeId:
    return UeId(kind="gNB", amf_ue_ngap_id=n, guami=Guami(plmn=plmn, amf_region_id=2, amf_set_id=3, amf_pointer=1))


def rrc(rsrp=-99.0, rsrq=-15.0, sinr=6.0, pci=12, nbs=(), lat=NAN, lon=NAN, speed=NAN, heading=NAN) -> RrcMeasReport:
    return RrcMeasReport(1, (ServingResult(0, CellResult(pci, rsrp, rsrq, sinr)),), tuple(nbs),
                         lat, lon, speed, heading)


def rc_indication(u: UeId, r: RrcMeasReport, cell: int = 0xA81B0C, sn: int = 0, rf: int = 3) -> bytes:
    h, m = encode_rc_message_copy(RcMessageCopy(encode_rrc_meas_report(r), u, Cgi("00101", cell)))
    return encode_ric_indication(RicIndication(1, 1, rf, 1, h, m, sn=sn))


def kpm_indication(reports, t: float = 1_700_000_000.5, rf: int = 2) -> bytes:
    h, m = encode_kpm_indication(KpmIndication(t, tuple(KpmUeReport(u, tuple(v)) for u, v in reports)))
    return encode_ric_indication(RicIndication(1, 2, rf, 1, h, m, sn=1))


def random_cell(rng: random.Random) -> CellResult:
    return CellResult(rng.choice([-1, rng.randrange(1008)]),
                      rng.choice([NAN, float(rng.randrange(-160, -25))]),
                      rng.choice([NAN, rng.randrange(-90, 45) / 2]),
                      rng.choice([NAN, rng.randrange(-50, 85) / 2]))


def random_rrc(rng: random.Random) -> RrcMeasReport:
    lat = rng.choice([NAN, rng.uniform(-90, 90)])
    lon = rng.uniform(-180, 180) if lat == lat else NAN
    has_v = rng.random() < 0.5
    return RrcMeasReport(
        rng.randrange(1, 65),
        tuple(ServingResult(rng.randrange(32), random_cell(rng)) for _ in range(rng.randrange(1, 4))),
        tuple(random_cell(rng) for _ in range(rng.randrange(0, 9))), lat, lon,
        rng.uniform(0, 60) if has_v else NAN, rng.uniform(0, 360) if has_v else NAN)


@pytest.fixture
def e2():
    return SimpleNamespace(ue=ue, rrc=rrc, rc_indication=rc_indication, kpm_indication=kpm_indication,
                           random_rrc=random_rrc, random_cell=random_cell)
