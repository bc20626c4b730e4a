"""Handover prediction: target cell and handover time from measurement tracks (paper §4.2).

Public API: ``Prediction``, ``Predictor`` (protocol), ``A3Forecaster``, ``CVHPredictor``,
``PlacesPredictor``, ``HistoryPredictor``, ``CombinedPredictor``, ``HandoverPredictor`` (the
facade the xApp calls: ``observe(report)`` per report, ``update(store)`` per cycle for the UEs
whose tracks changed, ``predict(track, now)`` for one UE), ``Predictions`` (its batched output),
``forecast_batch`` (A3 for many UEs at once), ``Knowledge`` (association map, handover places,
successors, neighbour relation table), ``PredictorConfig``, ``Stabiliser``, ``Calibrator``.
Evaluation (offline, outside the xApp): ``python -m pallas_tools.evaluate``.
"""

from xapp.predict.a3 import A3Batch, A3Forecaster, forecast_batch
from xapp.predict.base import (Calibrator, Prediction, Predictor, Stabiliser, load_calibrators, reliability,
                               theil_sen)
from xapp.predict.combined import CombinedPredictor, HandoverPredictor, HistoryPredictor, Predictions
from xapp.predict.config import A3Config, CVHConfig, HistoryConfig, PredictorConfig, StabilityConfig
from xapp.predict.cvh import CVHPredictor, PlacesPredictor
from xapp.predict.maps import (AssociationMap, HandoverPlaces, Knowledge, NeighbourRelations, TransitionModel,
                               knowledge_from_drives_at)

__all__ = [
    "A3Forecaster", "Calibrator", "Prediction", "load_calibrators", "Predictor", "Stabiliser", "reliability", "theil_sen",
    "CombinedPredictor", "HandoverPredictor", "HistoryPredictor", "A3Config", "CVHConfig", "HistoryConfig",
    "PredictorConfig", "StabilityConfig", "CVHPredictor", "AssociationMap", "Knowledge", "NeighbourRelations",
    "TransitionModel", "A3Batch", "forecast_batch", "Predictions", "PlacesPredictor", "HandoverPlaces",
    "knowledge_from_drives_at",
]
