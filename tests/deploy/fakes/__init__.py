"""Fake vendor executables and services for the deploy tests (the true external boundary of the adapters).

- ``_runtime``: what every fake program shares: the call log (argv, cwd, names of watched environment
  variables, stdin saved to its own file) and a JSON "world" file per vendor that the test writes and the
  fake reads and updates, so a scenario (app exists, name taken, checks turning green) spans calls.
- ``harness.FakeCliEnv``: installs fakes as executables in a bin directory (``#!`` the test interpreter) and
  reads the log back; ``make_context`` builds a DeployContext over them.
- ``flyctl`` and ``railway``: fake ``flyctl``/``fly`` and ``railway`` CLIs. They accept only the flags the
  real commands document (an unknown flag fails like the real CLI), print the real ``--json`` shapes, and
  keep state in their world file.
- ``railway_api``: a loopback HTTP server speaking the part of Railway's GraphQL API the adapter uses.

Other fakes can be added here under other module names; install them with ``FakeCliEnv.install``.
"""
