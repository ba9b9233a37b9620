"""Pure classifier-calibration functions: FFC (SphereFed) and CCVR."""
from fedlatent.calibration.ccvr import class_statistics, pool_statistics, retrain_classifier, sample_virtual_features
from fedlatent.calibration.ffc import ffc_solve, ffc_statistics

__all__ = ["ffc_statistics", "ffc_solve", "class_statistics", "pool_statistics", "sample_virtual_features",
           "retrain_classifier"]
