"""A base for test stand-ins of xapp.policy.PolicyClient: ``send(action)`` calls the stand-in's
``trigger`` / ``cancel`` / ``commit`` with PolicyClient's by-hand signatures, so a fake records
orders in the terms the tests read."""

from pallas_common.schemes import scheme_name


class OrdersByKind:
    def send(self, a):
        kind = getattr(a, "rpc", None)      # the action's kind: its Control RPC
        if kind == "Trigger":
            return self.trigger(a.source, a.session_id, a.epoch, a.target, split_tokens=a.split_tokens,
                                predicted_handover_time=a.predicted_handover_time,
                                scheme=scheme_name(a.scheme), window_s=a.window_s)
        if kind == "Commit":
            return self.commit(a.source, a.session_id, a.epoch, a.actual_target, scheme=scheme_name(a.scheme),
                               handover_time=a.handover_time)
        if kind == "Cancel":
            return self.cancel(a.source, a.session_id, a.epoch, a.reason)
        raise TypeError(a)
