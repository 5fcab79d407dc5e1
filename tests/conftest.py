import pytest

from tests.util import run, stack_config


@pytest.fixture(scope="session")
def dev_result():
    """The dev stack run once under mocks (read-only: do not mutate)."""
    return run(stack_config("dev"))


@pytest.fixture(scope="session")
def p4de_result():
    """The p4de example stack run once under mocks (read-only)."""
    return run(stack_config("p4de"), stack="p4de")
