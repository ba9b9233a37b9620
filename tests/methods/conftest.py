"""Shared fixtures of the method tests: their end-to-end runs draw no figures (tested elsewhere)."""
import pytest


@pytest.fixture(scope="module", autouse=True)
def _no_plots(no_figures):
    yield
