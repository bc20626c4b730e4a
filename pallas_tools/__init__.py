"""Offline drive and E2 trace tools: what makes the xApp's inputs and scores its predictor, never
part of a deployable (the xApp's image copies ``xapp/`` alone; nothing in ``xapp/`` or ``agent/``
imports this package). It imports the xApp's own code (encoders beside its decoders, the drive
reader, the predictor), so what it makes is what the xApp reads.

- :mod:`.radio`: the synthetic drive generator (gNB sites, TR 38.901 path loss, A3 handovers);
- :mod:`.tracegen`: E2AP / E2SM-RC / E2SM-KPM / NR RRC encoders for traces, benchmarks and tests
  (their decoders and types: the xApp's own :mod:`xapp.e2` layer modules);
- :mod:`.convert`: ``python -m pallas_tools.convert``, drive-test CSVs -> one E2 trace per UE;
- :mod:`.evaluate`: ``python -m pallas_tools.evaluate``, the handover predictor scored on drives.

The package, :mod:`.radio` and :mod:`.evaluate` import in both environments; :mod:`.tracegen`
and :mod:`.convert` need pycrate and asn1tools, which only the xApp's environment
(``.venv/xapp``) has.
"""
