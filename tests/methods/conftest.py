"""Shared fixtures of the method tests."""
import pytest

from fedlatent.experiment import single as experiment


@pytest.fixture(scope="module", autouse=True)
def _no_plots():
    """End-to-end method runs skip the matplotlib figures (their content is tested elsewhere)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(experiment, "learning_curves", lambda *a, **k: None)
        mp.setattr(experiment, "partition_heatmap", lambda *a, **k: None)
        yield
