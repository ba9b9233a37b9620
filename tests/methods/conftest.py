"""Shared fixtures of the method tests."""
import pytest

from fedlatent.experiment import single as experiment


class _NoFigures:
    """Stands in for the figure worker: end-to-end method runs draw no figures (their content is
    tested elsewhere), so they start no child process."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def draw(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture(scope="module", autouse=True)
def _no_plots():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(experiment, "FigureWorker", _NoFigures)
        yield
