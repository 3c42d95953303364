import pytest

from tests.integration.cluster import LocalCluster

# PostgreSQL fixtures (postgres, postgres_url, db_url): a server the tests start themselves.
pytest_plugins = ["tests.integration.postgres"]


@pytest.fixture
def make_cluster(tmp_path):
    """Start real local clusters (server + agent processes); all are stopped at the end of the test."""
    started: list[LocalCluster] = []

    def make(**kw) -> LocalCluster:
        c = LocalCluster(tmp_path / f"cluster{len(started)}", **kw)
        started.append(c)
        return c.up()

    yield make
    for c in started:
        c.down()


@pytest.fixture
def cluster(make_cluster) -> LocalCluster:
    """A 2-node cluster with 4 fake A100s per node."""
    return make_cluster()
