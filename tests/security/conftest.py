"""The attacker's seat: login users in each role, on the real stack.

The ``login`` fixture of ``tests/conftest.py`` (``login(role, tenant=...)``) creates a
Postgres login user in a role (``blackbox_writer``, ``blackbox_reader``,
``blackbox_replayer``, ``blackbox_relay``), optionally granted one tenant, and returns an
engine connected as that user; the services, the per-test database and the settings come
from there too. The tenants the tests play with are named here.
"""

from __future__ import annotations

TENANT_A = "tenant-a"
TENANT_B = "tenant-b"
