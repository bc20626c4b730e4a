"""One namespace for making and checking E2 messages: the xApp's decoders and E2 types, re-exported
from the layer modules that hold them (:mod:`xapp.e2.ie`, :mod:`xapp.e2.e2ap`, :mod:`xapp.e2.rrc`,
:mod:`xapp.e2.sm_rc`, :mod:`xapp.e2.sm_kpm`), beside the encoders of :mod:`pallas_tools.tracegen`.
For the tools, the tests and the benchmarks (``from pallas_tools import codec as C``); the xApp
imports the layer modules themselves and never this module.
"""

from __future__ import annotations

from pallas_tools.tracegen import (encode_cgi, encode_kpm_indication, encode_location,  # noqa: F401
                                   encode_rc_message_copy, encode_ric_indication, encode_ric_indication_pycrate,
                                   encode_rrc_meas_report, encode_rrc_meas_report_pycrate, encode_ueid,
                                   encode_velocity)
from xapp.e2.e2ap import (IE_RAN_FUNCTION_ID, IE_RIC_ACTION_ID, IE_RIC_CALL_PROCESS_ID,  # noqa: F401
                          IE_RIC_INDICATION_HEADER, IE_RIC_INDICATION_MESSAGE, IE_RIC_INDICATION_SN,
                          IE_RIC_INDICATION_TYPE, IE_RIC_REQUEST_ID, PROC_RIC_INDICATION, RicIndication,
                          decode_e2ap_pycrate, decode_ric_indication)
from xapp.e2.ie import (ASN1_PATH, Cgi, E2DecodeError, GlobalGnbId, Guami, UeId, cgi_from_asn,  # noqa: F401
                        cgi_to_asn, decode_cgi, decode_ueid, e2_node_name, e2sm_spec, plmn_from_bytes,
                        plmn_to_bytes, ueid_from_asn, ueid_to_asn)
from xapp.e2.rrc import (RRC_MSG_ID_MEASUREMENT_REPORT, BeamResult, CellResult, EutraResult,  # noqa: F401
                         RrcMeasReport, ServingResult, decode_location, decode_rrc_meas_report,
                         decode_rrc_meas_report_pycrate, decode_velocity)
from xapp.e2.sm_kpm import (KPM_STYLE_UE_CONDITION, NTP_EPOCH_OFFSET, KpmIndication, KpmUeReport,  # noqa: F401
                            decode_kpm_indication, kpm_action_definition_ue_level, kpm_event_trigger,
                            ntp_to_time, time_to_ntp)
from xapp.e2.sm_rc import (RC_PARAM_CELL_GLOBAL_ID, RC_PARAM_RRC_MESSAGE, RC_PARAM_UE_ID,  # noqa: F401
                           RC_STYLE_MESSAGE_COPY, RcHeader, RcMessageCopy, decode_rc_header,
                           decode_rc_message_copy, rc_action_definition_message_copy,
                           rc_event_trigger_message_copy)
