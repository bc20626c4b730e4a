"""E2 ingestion: standard E2 messages in, UE measurement tracks out, live over RMR or replayed.

- :mod:`.codec`: E2AP RICindication, E2SM-RC REPORT Style 1 (message copy), E2SM-KPM Format 3,
  NR RRC MeasurementReport (with locationInfo-r16), subscription payloads; encode and decode.
- :mod:`.fastper`: the hot-path PER walkers/encoders (pycrate/asn1tools remain the reference).
- :mod:`.units`: TS 38.133 reporting ranges, TS 23.032/37.355 position and velocity coding.
- :mod:`.ingest`: indications -> MeasurementReports -> :class:`xapp.tracks.TrackStore`.
- :mod:`.transport`: the RMR seam (:class:`~.transport.Transport`; RMRXapp live, trace replay).
- :mod:`.subscription`: E2 subscriptions through submgr's REST API.
- :mod:`.trace`: the test-mode trace format (README "Trace format"), writer, reader, replay.
- ``python -m xapp.e2.inspect``: a trace or one PDU as JSON lines.
- ``python -m xapp.e2.convert``: G-NetTrack Pro drive CSVs -> traces.

The project's E2SM ASN.1 is ``asn1/pallas-e2sm.asn`` (compiled with asn1tools, aligned PER).
"""
