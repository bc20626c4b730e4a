"""Compatibility facade: the names ``xapp.e2.codec`` used to define, re-exported from the layer
modules that now hold them (:mod:`.ie`, :mod:`.e2ap`, :mod:`.rrc`, :mod:`.sm_rc`, :mod:`.sm_kpm`)
and, for the encoders, from :mod:`.tracegen`. New code imports the layer modules; the xApp's
decode path (:mod:`.ingest`) does not import this module. Nothing here imports it back.
"""

from __future__ import annotations

from .e2ap import (IE_RAN_FUNCTION_ID, IE_RIC_ACTION_ID, IE_RIC_CALL_PROCESS_ID,  # noqa: F401
                   IE_RIC_INDICATION_HEADER, IE_RIC_INDICATION_MESSAGE, IE_RIC_INDICATION_SN,
                   IE_RIC_INDICATION_TYPE, IE_RIC_REQUEST_ID, PROC_RIC_INDICATION, RicIndication,
                   decode_e2ap_pycrate, decode_ric_indication)
from .ie import (ASN1_PATH, Cgi, E2DecodeError, GlobalGnbId, Guami, UeId, cgi_from_asn,  # noqa: F401
                 cgi_to_asn, decode_cgi, decode_ueid, e2_node_name, e2sm_spec, plmn_from_bytes,
                 plmn_to_bytes, ueid_from_asn, ueid_to_asn)
from .rrc import (RRC_MSG_ID_MEASUREMENT_REPORT, BeamResult, CellResult, EutraResult,  # noqa: F401
                  RrcMeasReport, ServingResult, decode_location, decode_rrc_meas_report,
                  decode_rrc_meas_report_pycrate, decode_velocity)
from .sm_kpm import (KPM_STYLE_UE_CONDITION, NTP_EPOCH_OFFSET, KpmIndication, KpmUeReport,  # noqa: F401
                     decode_kpm_indication, kpm_action_definition_ue_level, kpm_event_trigger,
                     ntp_to_time, time_to_ntp)
from .sm_rc import (RC_PARAM_CELL_GLOBAL_ID, RC_PARAM_RRC_MESSAGE, RC_PARAM_UE_ID,  # noqa: F401
                    RC_STYLE_MESSAGE_COPY, RcHeader, RcMessageCopy, decode_rc_header,
                    decode_rc_message_copy, rc_action_definition_message_copy,
                    rc_event_trigger_message_copy)
from .tracegen import (encode_cgi, encode_kpm_indication, encode_location,  # noqa: F401
                       encode_rc_message_copy, encode_ric_indication, encode_ric_indication_pycrate,
                       encode_rrc_meas_report, encode_rrc_meas_report_pycrate, encode_ueid,
                       encode_velocity)
