"""Handover prediction: target cell and handover time from measurement tracks (paper §4.2).

Public API: ``Prediction``, ``Predictor`` (protocol), ``A3Forecaster``, ``CVHPredictor``,
``HistoryPredictor``, ``CombinedPredictor``, ``HandoverPredictor`` (the facade the xApp calls),
``Knowledge`` (association map, successors, neighbour relations), ``PredictorConfig``,
``Stabiliser``, ``Calibrator``. Evaluation: ``python -m xapp.predict.evaluate``.
"""

from xapp.predict.a3 import A3Forecaster
from xapp.predict.base import Calibrator, Prediction, Predictor, Stabiliser, reliability, theil_sen
from xapp.predict.combined import CombinedPredictor, HandoverPredictor, HistoryPredictor
from xapp.predict.config import A3Config, CVHConfig, HistoryConfig, PredictorConfig, StabilityConfig
from xapp.predict.cvh import CVHPredictor
from xapp.predict.maps import AssociationMap, Knowledge, NeighbourRelations, TransitionModel

__all__ = [
    "A3Forecaster", "Calibrator", "Prediction", "Predictor", "Stabiliser", "reliability", "theil_sen",
    "CombinedPredictor", "HandoverPredictor", "HistoryPredictor", "A3Config", "CVHConfig", "HistoryConfig",
    "PredictorConfig", "StabilityConfig", "CVHPredictor", "AssociationMap", "Knowledge", "NeighbourRelations",
    "TransitionModel",
]
