"""eventsourcing's own conformance tests, run on pmemwal.integrations.eventsourcing.

Each class subclasses one of eventsourcing's abstract test cases unchanged and supplies only
what it asks for (a recorder, a factory's environment, the expected classes).  Every recorder
gets a fresh directory on tmpfs, with 1 MiB segments; tests/test_eventsourcing_crash.py has
the tests of this module's own promises (durability, atomic batches, replay).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from unittest import TestCase, mock

import pytest

pytest.importorskip("eventsourcing")
pytest.importorskip("Crypto", reason="eventsourcing's test cases import its AES cipher: "
                    "pip install 'eventsourcing[crypto]'")

from eventsourcing.dcb import tests as es_dcb  # noqa: E402
from eventsourcing.persistence import InfrastructureFactory  # noqa: E402

# The modules, not their classes: pytest would collect (and run) any TestCase named here.
from eventsourcing.tests import application as es_application  # noqa: E402
from eventsourcing.tests import persistence as es_persistence  # noqa: E402
from eventsourcing.utils import Environment  # noqa: E402

from pmemwal.integrations import eventsourcing as pes  # noqa: E402

MODULE = "pmemwal.integrations.eventsourcing"


def module_env(test: TestCase) -> dict[str, str]:
    """The variables that select this module, with a fresh directory removed after ``test``."""
    base = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None,
                            prefix="pmemwal-es-")
    test.addCleanup(shutil.rmtree, base, ignore_errors=True)
    return {"PERSISTENCE_MODULE": MODULE, "PMEMWAL_PATH": base,
            "PMEMWAL_SEGMENT_SIZE": str(1 << 20)}


def new_factory(test: TestCase) -> pes.PmemwalFactory:
    """A factory over a fresh directory, closed after ``test`` (before the directory goes)."""
    factory = InfrastructureFactory.construct(Environment(env=module_env(test)))
    test.addCleanup(factory.close)
    assert isinstance(factory, pes.PmemwalFactory)
    return factory


def use_module_in_environ(test: TestCase) -> None:
    """Applications built with os.environ get this module during ``test``."""
    patcher = mock.patch.dict(os.environ, module_env(test))
    patcher.start()
    test.addCleanup(patcher.stop)


class TestAggregateRecorder(es_persistence.AggregateRecorderTestCase):
    def create_recorder(self) -> pes.PmemwalAggregateRecorder:
        return new_factory(self).aggregate_recorder()


class TestApplicationRecorder(
        es_persistence.ApplicationRecorderTestCase[pes.PmemwalApplicationRecorder]):
    def create_recorder(self) -> pes.PmemwalApplicationRecorder:
        return new_factory(self).application_recorder()

    def test_insert_subscribe(self) -> None:
        # The base class offers this test for recorders that support subscriptions.
        self.optional_test_insert_subscribe()


class TestTrackingRecorder(es_persistence.TrackingRecorderTestCase):
    def create_recorder(self) -> pes.PmemwalTrackingRecorder:
        return new_factory(self).tracking_recorder()


class TestProcessRecorder(es_persistence.ProcessRecorderTestCase):
    def create_recorder(self) -> pes.PmemwalProcessRecorder:
        return new_factory(self).process_recorder()


class TestNonInterleavingNotificationIDs(es_persistence.NonInterleavingNotificationIDsBaseCase):
    def create_recorder(self) -> pes.PmemwalApplicationRecorder:
        return new_factory(self).application_recorder()


class TestDCBRecorder(es_dcb.DCBRecorderTestCase):
    """eventsourcing 9.5's DCB recorder case, whose tests its subclasses call (as its own POPO
    and PostgreSQL tests do): on a fresh log, then on one reopened with events in it."""

    def test_append_read(self) -> None:
        self._test_append_read(new_factory(self).dcb_recorder())

    def test_append_subscribe(self) -> None:
        self._test_append_subscribe(new_factory(self).dcb_recorder())

    def test_append_read_after_reopening(self) -> None:
        env = Environment(env=module_env(self))
        factory = InfrastructureFactory.construct(env)
        self._test_append_read(factory.dcb_recorder())
        factory.close()
        factory = InfrastructureFactory.construct(env)
        self.addCleanup(factory.close)
        self._test_append_read(factory.dcb_recorder(), initial_position=13)


class MyTrackingRecorder(pes.PmemwalTrackingRecorder):
    """A subclass the factory test asks for (by class and by topic: it must be module-level)."""


class TestFactory(es_persistence.InfrastructureFactoryTestCase[pes.PmemwalFactory]):
    def setUp(self) -> None:
        self.env = Environment("TestCase", module_env(self))
        super().setUp()

    def expected_factory_class(self) -> type[pes.PmemwalFactory]:
        return pes.PmemwalFactory

    def expected_aggregate_recorder_class(self) -> type[pes.PmemwalAggregateRecorder]:
        return pes.PmemwalAggregateRecorder

    def expected_application_recorder_class(self) -> type[pes.PmemwalApplicationRecorder]:
        return pes.PmemwalApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[pes.PmemwalTrackingRecorder]:
        return pes.PmemwalTrackingRecorder

    def tracking_recorder_subclass(self) -> type[pes.PmemwalTrackingRecorder]:
        return MyTrackingRecorder

    def expected_process_recorder_class(self) -> type[pes.PmemwalProcessRecorder]:
        return pes.PmemwalProcessRecorder


class TestExampleApplication(es_application.ExampleApplicationTestCase):
    expected_factory_topic = f"{MODULE}:PmemwalFactory"

    def setUp(self) -> None:
        super().setUp()
        use_module_in_environ(self)


class TestApplication(es_application.ApplicationTestCase):
    """eventsourcing's Application tests, whose applications take the module from os.environ."""

    def setUp(self) -> None:
        super().setUp()
        use_module_in_environ(self)
