import math

import numpy as np
import pytest

from xapp.tracks import MeasurementReport, NeighbourMeas, TrackStore, UETrack


def rep(t, cell=1, rsrp=-90.0, nbs=()):
    return MeasurementReport(time=t, ue_id="ue1", serving_cell=cell, rsrp_dbm=rsrp, neighbours=tuple(nbs))


def test_ring_buffer_keeps_newest_in_order():
    tr = UETrack("ue1", capacity=4, max_neighbours=2)
    for i in range(10):
        tr.append(rep(float(i), cell=i))
    v = tr.view()
    assert len(tr) == 4
    assert v.time.tolist() == [6.0, 7.0, 8.0, 9.0]
    assert v.serving_cell.tolist() == [6, 7, 8, 9]
    assert tr.view(last=2).time.tolist() == [8.0, 9.0]


def test_neighbours_cut_to_strongest_and_padded():
    tr = UETrack("ue1", capacity=4, max_neighbours=2)
    nbs = [NeighbourMeas(pci=p, rsrp_dbm=r) for p, r in [(1, -100.0), (2, -80.0), (3, -90.0)]]
    tr.append(rep(0.0, nbs=nbs))
    tr.append(rep(1.0, nbs=nbs[:1]))
    v = tr.view()
    assert v.nb_pci[0].tolist() == [2, 3]
    assert v.nb_pci[1].tolist() == [1, -1]
    assert math.isnan(v.nb_rsrp_dbm[1, 1])


def test_out_of_order_rejected_and_state_kept():
    tr = UETrack("ue1", capacity=4)
    tr.append(rep(5.0))
    with pytest.raises(ValueError, match="older"):
        tr.append(rep(4.0))
    assert len(tr) == 1 and tr.view().time.tolist() == [5.0]


def test_store_bounds_ues_and_memory():
    st = TrackStore(capacity=8, max_neighbours=4, max_ues=3)
    for i in range(5):
        st.add(MeasurementReport(time=float(i), ue_id=f"u{i}", serving_cell=1))
    assert len(st) == 3 and st.get("u0") is None and st.get("u4") is not None
    nbytes = st.get("u4").nbytes
    assert nbytes == UETrack("x", 8, 4).nbytes
    assert np.isfinite(nbytes) and nbytes < 8 * (61 + 25 * 4) + 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_time_rejected_and_no_empty_track_left(bad):
    st = TrackStore(max_ues=1)
    st.add(MeasurementReport(1.0, "a", 1, -90.0))
    with pytest.raises(ValueError, match="non-finite time"):
        st.add(MeasurementReport(bad, "b", 2, -90.0))        # a new UE: no track is created
    assert len(st) == 1 and st.get("b") is None and st.get("a") is not None
    with pytest.raises(ValueError, match="non-finite time"):
        st.add(MeasurementReport(bad, "a", 1, -91.0))        # a known UE: its track unchanged
    assert st.get("a").view().rsrp_dbm.tolist() == [-90.0]
    st.add(MeasurementReport(2.0, "a", 1, -92.0))            # the order check still works after
    st.add(MeasurementReport(3.0, "c", 3, -80.0))            # eviction finds a real oldest
    assert [t.ue_id for t in st] == ["c"]


def test_store_evicts_the_ue_heard_from_least_recently():
    st = TrackStore(capacity=4, max_neighbours=1, max_ues=2)
    st.add(MeasurementReport(time=0.0, ue_id="a", serving_cell=1))
    st.add(MeasurementReport(time=1.0, ue_id="b", serving_cell=1))
    st.add(MeasurementReport(time=2.0, ue_id="a", serving_cell=1))   # a is now the fresher
    st.add(MeasurementReport(time=3.0, ue_id="c", serving_cell=1))
    assert st.get("b") is None and st.get("a") is not None and st.get("c") is not None
