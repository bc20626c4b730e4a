"""E2 ingestion: standard E2 messages in, UE measurement tracks out, live over RMR or replayed.

Decoders, one module per protocol layer (no import cycle: each imports only :mod:`.ie` /
:mod:`.per` and the layer it carries):

- :mod:`.ie`: E2SM common IEs (UEID, CGI, PLMN, GUAMI), the decode error, the compiled E2SM ASN.1;
- :mod:`.per`: the PER walker primitives;
- :mod:`.e2ap`: E2AP RICindication (walker, pycrate for the rest);
- :mod:`.sm_rc`: E2SM-RC REPORT Style 1 message copy, header Formats 1-3 (v01.03, v03.00+);
- :mod:`.sm_kpm`: E2SM-KPM v02.00-v04.00 header Format 1, message Formats 1-3 (walker for Format 3);
- :mod:`.rrc`: NR RRC MeasurementReport (SSB and CSI-RS cell and per-beam results, E-UTRA
  neighbours, locationInfo-r16; walker, pycrate for the rest);
- :mod:`.units`: TS 38.133 reporting ranges, TS 23.032/37.355 position and velocity coding.

Around them: :mod:`.ingest` (indications -> MeasurementReports -> :class:`xapp.tracks.TrackStore`),
:mod:`.transport` (RMR seam), :mod:`.subscription` (submgr REST), :mod:`.trace` (test-mode trace
format) and ``python -m xapp.e2.inspect``. The encoders that make traces, benchmarks and tests
and the drive-CSV converter are offline tools, outside the xApp (:mod:`pallas_tools.tracegen`,
``python -m pallas_tools.convert``).

The project's E2SM ASN.1 is ``asn1/pallas-e2sm.asn`` (compiled with asn1tools, aligned PER).
"""
